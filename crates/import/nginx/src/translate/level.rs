//! What a level (`http`, `server`, `location`) passes down to the levels inside it: nginx
//! inherits most directives, and a list directive (`proxy_set_header`, `add_header`,
//! `allow`/`deny`, `error_page`, `limit_req`) defined at a level replaces its parent's list
//! entirely.

use std::rc::Rc;

use veloxy_import::Loc;

/// A request header edit from `proxy_set_header`.
#[derive(Debug, Clone, PartialEq)]
pub enum ReqHeader {
    /// Set to this template.
    Set(String, String),
    /// `proxy_set_header NAME "";`: not sent.
    Remove(String),
    /// `proxy_set_header NAME $v` with `auth_request_set $v $upstream_http_NAME`: the auth
    /// answer's field of the same name (forward_auth `copy_headers`).
    Auth(String),
    /// What veloxy does already (`X-Forwarded-For $proxy_add_x_forwarded_for`, the WebSocket
    /// `Upgrade`/`Connection` pair, `Host $http_host`).
    Default(String),
}

impl ReqHeader {
    /// The field name.
    pub fn name(&self) -> &str {
        match self {
            ReqHeader::Set(n, _)
            | ReqHeader::Remove(n)
            | ReqHeader::Default(n)
            | ReqHeader::Auth(n) => n,
        }
    }
}

/// One `auth_request_set`: the variable (without `$`) and the auth answer's field it holds
/// (`None`: a value other than `$upstream_http_NAME`).
pub type AuthVar = (String, Option<String>);

/// One `allow`/`deny` rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Access {
    /// `allow` (true) or `deny`.
    pub allow: bool,
    /// An address or CIDR, or `all`.
    pub who: String,
    /// Where.
    pub loc: Loc,
}

/// `limit_req zone=NAME burst=N nodelay`.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitReq {
    /// The zone.
    pub zone: String,
    /// `burst=N`.
    pub burst: u32,
    /// Where.
    pub loc: Loc,
}

/// `root` or `alias`.
#[derive(Debug, Clone, PartialEq)]
pub struct Root {
    /// The directory as written.
    pub path: String,
    /// `alias` (the location prefix is replaced) rather than `root` (appended to).
    pub alias: bool,
}

/// The inherited settings at one level.
#[derive(Debug, Clone, Default)]
pub struct Level {
    /// `proxy_set_header`s of the nearest level that has any.
    pub proxy_headers: Option<Rc<Vec<ReqHeader>>>,
    /// `add_header`s (name, template) of the nearest level that has any.
    pub add_headers: Option<Rc<Vec<(String, String)>>>,
    /// `client_max_body_size` as a veloxy size (`None`: unlimited, "0").
    pub max_body: Option<Option<String>>,
    /// `gzip on`.
    pub gzip: bool,
    /// `root` / `alias`.
    pub root: Option<Root>,
    /// `index`.
    pub index: Option<Vec<String>>,
    /// `autoindex on`.
    pub autoindex: bool,
    /// `proxy_connect_timeout`, `proxy_read_timeout`, `proxy_send_timeout` (veloxy durations).
    pub timeouts: [Option<String>; 3],
    /// `auth_basic` realm (`None` inside: `auth_basic off`).
    pub auth_realm: Option<Option<String>>,
    /// `auth_basic_user_file`, as an output path.
    pub auth_file: Option<String>,
    /// `allow` / `deny` rules of the nearest level that has any.
    pub access: Option<Rc<Vec<Access>>>,
    /// `limit_req`s of the nearest level that has any.
    pub limit_req: Option<Rc<Vec<LimitReq>>>,
    /// `error_page` codes -> URI (and the line), of the nearest level that has any.
    pub error_pages: Option<Rc<Vec<(String, String, Loc)>>>,
    /// `default_type`.
    pub default_type: Option<String>,
    /// `$server_name`: the server's first name as written (`None` outside a server, or
    /// when that name is a regex or wildcard).
    pub server_name: Option<String>,
    /// `proxy_cache` and its companions.
    pub cache: super::cache::Settings,
    /// `expires` as a Cache-Control value (`None`: off).
    pub expires: Option<String>,
    /// `set $name value` constants.
    pub constants: std::collections::BTreeMap<String, String>,
    /// `proxy_ssl_verify on`.
    pub ssl_verify: bool,
    /// `proxy_ssl_trusted_certificate`, as an output path.
    pub ssl_ca: Option<String>,
    /// `proxy_ssl_server_name`/`proxy_ssl_name`: the SNI sent to an https upstream.
    pub ssl_name: Option<String>,
    /// `ssl_certificate` and `ssl_certificate_key` (output paths).
    pub cert: Option<String>,
    /// The key.
    pub key: Option<String>,
    /// `proxy_next_upstream off`: no retry on another server.
    pub no_retry: bool,
    /// `auth_request URI` in effect, with where it is written (`Some(None)`: `auth_request
    /// off`).
    pub auth_request: Option<Option<(String, Loc)>>,
    /// `auth_request_set`s of the nearest level that has any: variable (without `$`) -> the
    /// auth answer's field it holds (`None`: a value other than `$upstream_http_NAME`).
    pub auth_vars: Option<Rc<Vec<AuthVar>>>,
    /// `proxy_hide_header` names of the nearest level that has any.
    pub hide_headers: Option<Rc<Vec<String>>>,
    /// `proxy_intercept_errors on`.
    pub intercept_errors: bool,
    /// This location answers an `auth_request` (its `proxy_set_header`s are the auth
    /// request's).
    pub auth_location: bool,
    /// `charset` (`None`: off, nginx's default).
    pub charset: Option<String>,
    /// Which lists this level has started itself (bits of [`Own`]): the first directive of
    /// a kind at a level replaces the inherited list.
    pub own: u16,
}

/// Bits of [`Level::own`].
pub struct Own;

impl Own {
    pub const PROXY_HEADERS: u16 = 1;
    pub const ADD_HEADERS: u16 = 2;
    pub const ACCESS: u16 = 4;
    pub const LIMIT_REQ: u16 = 8;
    pub const ERROR_PAGES: u16 = 16;
    pub const CACHE_VALID: u16 = 32;
    pub const AUTH_VARS: u16 = 64;
    pub const HIDE_HEADERS: u16 = 128;
}

impl Level {
    /// The level inside this one: the same settings, no list of its own yet.
    pub fn child(&self) -> Level {
        Level {
            own: 0,
            auth_location: false,
            ..self.clone()
        }
    }

    /// Starts this level's own list of kind `bit` (dropping the inherited one) if not yet.
    pub fn start<'a, T: Clone>(
        own: &mut u16,
        bit: u16,
        list: &'a mut Option<std::rc::Rc<Vec<T>>>,
    ) -> &'a mut Vec<T> {
        if *own & bit == 0 {
            *own |= bit;
            *list = Some(std::rc::Rc::new(Vec::new()));
        }
        std::rc::Rc::make_mut(list.get_or_insert_with(Default::default))
    }
}
