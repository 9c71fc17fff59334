//! The Gateway API v1 objects the provider reads (gateway.networking.k8s.io/v1, as in the
//! v1.6 CRDs, where TCPRoute and TLSRoute are v1 too): only the fields it translates, as serde structs made watchable by a
//! hand-written [`kube::Resource`] impl. Hand-written because the `gateway-api` crate needs
//! kube's derive and schemars (not in this build) and pins its own kube release; the
//! provider reads a small subset and writes status as JSON patches.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

/// The Gateway API group.
pub const GROUP: &str = "gateway.networking.k8s.io";

macro_rules! resource {
    ($t:ident, $kind:literal, $plural:literal, $scope:ty) => {
        impl kube::Resource for $t {
            type DynamicType = ();
            type Scope = $scope;
            fn kind(_: &()) -> Cow<'_, str> {
                $kind.into()
            }
            fn group(_: &()) -> Cow<'_, str> {
                GROUP.into()
            }
            fn version(_: &()) -> Cow<'_, str> {
                "v1".into()
            }
            fn plural(_: &()) -> Cow<'_, str> {
                $plural.into()
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

/// A GatewayClass (cluster-wide).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayClass {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: GatewayClassSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}
resource!(
    GatewayClass,
    "GatewayClass",
    "gatewayclasses",
    k8s_openapi::ClusterResourceScope
);

/// `GatewayClass.spec`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayClassSpec {
    #[serde(default)]
    pub controller_name: String,
}

/// A Gateway.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Gateway {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: GatewaySpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}
resource!(
    Gateway,
    "Gateway",
    "gateways",
    k8s_openapi::NamespaceResourceScope
);

/// `Gateway.spec`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySpec {
    #[serde(default)]
    pub gateway_class_name: String,
    #[serde(default)]
    pub listeners: Vec<Listener>,
    /// The addresses asked for (`gateway_addresses` honours an IP address of its pool).
    #[serde(default)]
    pub addresses: Vec<GatewayAddress>,
}

/// One of `spec.addresses`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayAddress {
    /// `IPAddress` (the default), `Hostname` or a vendor's type.
    #[serde(default)]
    pub r#type: Option<String>,
    #[serde(default)]
    pub value: String,
}

/// One of a Gateway's listeners.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Listener {
    pub name: String,
    #[serde(default)]
    pub hostname: Option<String>,
    #[serde(default)]
    pub port: i32,
    #[serde(default)]
    pub protocol: String,
    #[serde(default)]
    pub tls: Option<ListenerTls>,
    #[serde(default)]
    pub allowed_routes: Option<AllowedRoutes>,
}

/// `listeners[].tls`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerTls {
    #[serde(default)]
    pub mode: Option<String>,
    #[serde(default)]
    pub certificate_refs: Vec<ObjectRef>,
}

/// `listeners[].allowedRoutes`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AllowedRoutes {
    #[serde(default)]
    pub namespaces: Option<RouteNamespaces>,
    #[serde(default)]
    pub kinds: Vec<RouteGroupKind>,
}

/// `allowedRoutes.namespaces`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteNamespaces {
    #[serde(default)]
    pub from: Option<String>,
    /// With `from: Selector`: the labels a route's Namespace must have.
    #[serde(default)]
    pub selector: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
}

/// `allowedRoutes.kinds[]` and `supportedKinds[]`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RouteGroupKind {
    #[serde(default)]
    pub group: Option<String>,
    pub kind: String,
}

/// A reference to an object (certificateRefs, backendRefs): group "" is the core group.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub port: Option<i32>,
    #[serde(default)]
    pub weight: Option<i32>,
    #[serde(default)]
    pub filters: Vec<serde_json::Value>,
}

/// A route's `parentRefs[]`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ParentRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
}

/// An HTTPRoute.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRoute {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: RouteSpec<HttpRule>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}
resource!(
    HttpRoute,
    "HTTPRoute",
    "httproutes",
    k8s_openapi::NamespaceResourceScope
);

/// A GRPCRoute.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GrpcRoute {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: RouteSpec<GrpcRule>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}
resource!(
    GrpcRoute,
    "GRPCRoute",
    "grpcroutes",
    k8s_openapi::NamespaceResourceScope
);

/// `HTTPRoute.spec` / `GRPCRoute.spec`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteSpec<R> {
    #[serde(default)]
    pub parent_refs: Vec<ParentRef>,
    #[serde(default)]
    pub hostnames: Vec<String>,
    #[serde(default)]
    pub rules: Vec<R>,
}

impl<R> Default for RouteSpec<R> {
    fn default() -> Self {
        RouteSpec {
            parent_refs: Vec::new(),
            hostnames: Vec::new(),
            rules: Vec::new(),
        }
    }
}

/// `HTTPRoute.spec.rules[]`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRule {
    #[serde(default)]
    pub matches: Vec<HttpMatch>,
    #[serde(default)]
    pub filters: Vec<Filter>,
    #[serde(default)]
    pub backend_refs: Vec<ObjectRef>,
}

/// `rules[].matches[]` of an HTTPRoute.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpMatch {
    #[serde(default)]
    pub path: Option<PathMatch>,
    #[serde(default)]
    pub headers: Vec<ValueMatch>,
    #[serde(default)]
    pub query_params: Vec<ValueMatch>,
    #[serde(default)]
    pub method: Option<String>,
}

/// `matches[].path`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PathMatch {
    #[serde(default, rename = "type")]
    pub type_: Option<String>,
    #[serde(default)]
    pub value: Option<String>,
}

/// A header or query parameter match.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ValueMatch {
    #[serde(default, rename = "type")]
    pub type_: Option<String>,
    pub name: String,
    #[serde(default)]
    pub value: String,
}

/// `rules[].filters[]` (the types veloxy translates; others are refused by `type`).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Filter {
    #[serde(rename = "type")]
    pub type_: String,
    #[serde(default)]
    pub request_header_modifier: Option<HeaderModifier>,
    #[serde(default)]
    pub response_header_modifier: Option<HeaderModifier>,
    #[serde(default)]
    pub request_redirect: Option<Redirect>,
    #[serde(default)]
    pub url_rewrite: Option<UrlRewrite>,
    #[serde(default)]
    pub cors: Option<CorsFilter>,
    #[serde(default)]
    pub request_mirror: Option<RequestMirror>,
}

/// The RequestMirror filter (`HTTPRequestMirrorFilter`): at most one of `percent` and
/// `fraction`; neither mirrors every request.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestMirror {
    pub backend_ref: ObjectRef,
    #[serde(default)]
    pub percent: Option<i32>,
    #[serde(default)]
    pub fraction: Option<Fraction>,
}

/// `fraction`: `numerator / denominator` (default 100) of the requests.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Fraction {
    pub numerator: i32,
    #[serde(default)]
    pub denominator: Option<i32>,
}

/// The CORS filter (`HTTPCORSFilter`).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CorsFilter {
    #[serde(default)]
    pub allow_origins: Vec<String>,
    #[serde(default)]
    pub allow_credentials: Option<bool>,
    #[serde(default)]
    pub allow_methods: Vec<String>,
    #[serde(default)]
    pub allow_headers: Vec<String>,
    #[serde(default)]
    pub expose_headers: Vec<String>,
    #[serde(default)]
    pub max_age: Option<i64>,
}

/// A header modifier filter.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HeaderModifier {
    #[serde(default)]
    pub set: Vec<NameValue>,
    #[serde(default)]
    pub add: Vec<NameValue>,
    #[serde(default)]
    pub remove: Vec<String>,
}

/// A header to set or add.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct NameValue {
    pub name: String,
    #[serde(default)]
    pub value: String,
}

/// The RequestRedirect filter.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Redirect {
    #[serde(default)]
    pub scheme: Option<String>,
    #[serde(default)]
    pub hostname: Option<String>,
    #[serde(default)]
    pub path: Option<PathModifier>,
    #[serde(default)]
    pub port: Option<i32>,
    #[serde(default)]
    pub status_code: Option<u16>,
}

/// The URLRewrite filter.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UrlRewrite {
    #[serde(default)]
    pub hostname: Option<String>,
    #[serde(default)]
    pub path: Option<PathModifier>,
}

/// A redirect's or rewrite's `path`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PathModifier {
    #[serde(rename = "type")]
    pub type_: String,
    #[serde(default)]
    pub replace_full_path: Option<String>,
    #[serde(default)]
    pub replace_prefix_match: Option<String>,
}

/// `GRPCRoute.spec.rules[]`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GrpcRule {
    #[serde(default)]
    pub matches: Vec<GrpcMatch>,
    #[serde(default)]
    pub filters: Vec<Filter>,
    #[serde(default)]
    pub backend_refs: Vec<ObjectRef>,
}

/// `GRPCRoute.spec.rules[].matches[]`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GrpcMatch {
    #[serde(default)]
    pub method: Option<GrpcMethod>,
    #[serde(default)]
    pub headers: Vec<ValueMatch>,
}

/// `matches[].method` of a GRPCRoute.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GrpcMethod {
    #[serde(default, rename = "type")]
    pub type_: Option<String>,
    #[serde(default)]
    pub service: Option<String>,
    #[serde(default)]
    pub method: Option<String>,
}

/// A TCPRoute (v1 in the v1.6 CRDs, standard channel).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TcpRoute {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: RouteSpec<L4Rule>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}
resource!(
    TcpRoute,
    "TCPRoute",
    "tcproutes",
    k8s_openapi::NamespaceResourceScope
);

/// A TLSRoute (v1 in the v1.6 CRDs, standard channel): SNI hostnames to backends that
/// terminate TLS themselves (a listener in Passthrough mode).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsRoute {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: RouteSpec<L4Rule>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}
resource!(
    TlsRoute,
    "TLSRoute",
    "tlsroutes",
    k8s_openapi::NamespaceResourceScope
);

/// `TCPRoute.spec.rules[]` / `TLSRoute.spec.rules[]` (exactly one in v1).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct L4Rule {
    #[serde(default)]
    pub backend_refs: Vec<ObjectRef>,
}

/// A ReferenceGrant.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrant {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ReferenceGrantSpec,
}
resource!(
    ReferenceGrant,
    "ReferenceGrant",
    "referencegrants",
    k8s_openapi::NamespaceResourceScope
);

/// `ReferenceGrant.spec`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrantSpec {
    #[serde(default)]
    pub from: Vec<GrantFrom>,
    #[serde(default)]
    pub to: Vec<GrantTo>,
}

/// `ReferenceGrant.spec.from[]`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GrantFrom {
    #[serde(default)]
    pub group: String,
    pub kind: String,
    pub namespace: String,
}

/// `ReferenceGrant.spec.to[]`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GrantTo {
    #[serde(default)]
    pub group: String,
    pub kind: String,
    #[serde(default)]
    pub name: Option<String>,
}
