//! [`Late`]: live state a snapshot refers to but compiling does not make.
//!
//! Compiling a config starts nothing, binds nothing and creates nothing (`veloxy check` runs
//! it). What a route, group or listener needs at run time (a cache store, the Redis client, a
//! search cluster's view, the ACME certificate store) is a `Late` slot in the snapshot, left
//! empty by `compile`; the runtime fills every slot (`runtime::live::Live::bind`), reusing the
//! object of the same name from the previous generation, before the snapshot serves its first
//! request. Reading a bound slot is one atomic load, no lock and no lookup by name.

use std::sync::{Arc, OnceLock};

/// A slot for a live `T`, shared by every clone of the snapshot that made it. `T` may be a
/// trait object (`Late<dyn crate::tls::LiveCerts>`), for a lower layer that reads what a
/// higher one makes.
pub(crate) struct Late<T: ?Sized>(Arc<OnceLock<Arc<T>>>);

impl<T: ?Sized> Late<T> {
    /// An empty slot (as `compile` leaves it).
    pub(crate) fn empty() -> Self {
        Late(Arc::default())
    }

    /// A slot holding `value` already (unit tests that build objects by hand).
    #[cfg(test)]
    pub(crate) fn bound(value: Arc<T>) -> Self {
        let slot = Late::empty();
        slot.set(value);
        slot
    }

    /// The live object. Every slot of a snapshot is bound before a worker can read it, so
    /// an empty one here is a bug in the runtime.
    #[inline]
    pub(crate) fn get(&self) -> &Arc<T> {
        self.0
            .get()
            .expect("live state is bound by the runtime before its snapshot serves")
    }

    /// The live object, if bound.
    pub(crate) fn try_get(&self) -> Option<&Arc<T>> {
        self.0.get()
    }

    /// Whether both are the same slot (clones of one another).
    pub(crate) fn same(&self, other: &Late<T>) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Binds `value` unless the slot is bound already (a snapshot started twice in one
    /// process keeps its first objects); returns what the slot holds.
    pub(crate) fn set(&self, value: Arc<T>) -> &Arc<T> {
        self.0.get_or_init(|| value)
    }
}

impl<T: ?Sized> Default for Late<T> {
    fn default() -> Self {
        Late::empty()
    }
}

impl<T: ?Sized> Clone for Late<T> {
    fn clone(&self) -> Self {
        Late(self.0.clone())
    }
}

impl<T: ?Sized> std::fmt::Debug for Late<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "Late(bound)"
        } else {
            "Late(empty)"
        })
    }
}
