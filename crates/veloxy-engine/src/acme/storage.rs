//! The ACME account and certificates on disk, under `storage/<directory>/`:
//! `account.json` (the account's URL and key), `certs/<name>.crt` (the chain, leaf first) and
//! `certs/<name>.key` (PKCS#8 PEM). Every file is written to a temporary name with mode 0600,
//! synced, then renamed over the old one, so a crash leaves either the old file or the new
//! one, never half of one, and no other user can read a key.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// One directory's folder: the storage root plus a name made from the directory URL (its
/// host and port, and a hash of the whole URL), so two CAs never share an account.
pub fn directory_folder(storage: &Path, directory: &str) -> PathBuf {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    let host = directory
        .split("://")
        .nth(1)
        .unwrap_or(directory)
        .split('/')
        .next()
        .unwrap_or("");
    let safe: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let h = BuildHasherDefault::<DefaultHasher>::default().hash_one(directory);
    storage.join(format!("{safe}-{:08x}", h as u32))
}

/// Writes `data` to `path` atomically with mode 0600 (folders are created with mode 0700).
pub fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    if !dir.exists() {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    let tmp = dir.join(format!(
        ".{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("file")
    ));
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

/// The files of `name`'s certificate in `folder`.
pub fn cert_paths(folder: &Path, name: &str) -> (PathBuf, PathBuf) {
    let certs = folder.join("certs");
    (
        certs.join(format!("{name}.crt")),
        certs.join(format!("{name}.key")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_files_are_0600_and_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a/b/account.json");
        write_private(&p, b"one").unwrap();
        write_private(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let folder = std::fs::metadata(p.parent().unwrap()).unwrap();
        assert_eq!(folder.permissions().mode() & 0o777, 0o700);
    }

    #[test]
    fn directories_get_their_own_folders() {
        let root = Path::new("/s");
        let a = directory_folder(root, "https://acme-v02.api.letsencrypt.org/directory");
        let b = directory_folder(root, "https://127.0.0.1:14000/dir");
        assert!(a
            .to_str()
            .unwrap()
            .starts_with("/s/acme-v02.api.letsencrypt.org-"));
        assert!(b.to_str().unwrap().starts_with("/s/127.0.0.1_14000-"));
        assert_ne!(a, b);
    }
}
