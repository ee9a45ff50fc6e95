//! openid-connect's configuration: APISIX's schema and defaults, its cross-field rules, and the compiled [`Inner`]
//! (keys parsed, endpoints and session key built once per configuration).

use super::*;

pub(super) fn schema() -> Value {
    let mut s = json!({
        "type": "object",
        "properties": {
            "client_id": {"type": "string"},
            "client_secret": {"type": "string"},
            "discovery": {"type": "string"},
            "scope": {"type": "string", "default": "openid"},
            "ssl_verify": {"type": "boolean", "default": true},
            "timeout": {"type": "integer", "minimum": 1, "default": 3, "description": "timeout in seconds"},
            "introspection_endpoint": {"type": "string"},
            "introspection_endpoint_auth_method": {"type": "string", "default": "client_secret_basic"},
            "token_endpoint_auth_method": {"type": "string", "default": "client_secret_basic"},
            "bearer_only": {"type": "boolean", "default": false},
            "realm": {"type": "string", "default": "apisix"},
            "claim_validator": {
                "type": "object",
                "properties": {
                    "issuer": {"type": "object", "properties": {
                        "valid_issuers": {"type": "array", "items": {"type": "string"}}}},
                    "audience": {"type": "object", "properties": {
                        "claim": {"type": "string", "default": "aud"},
                        "required": {"type": "boolean", "default": false},
                        "match_with_client_id": {"type": "boolean", "default": false}}}
                }
            },
            "logout_path": {"type": "string", "default": "/logout"},
            "redirect_uri": {"type": "string"},
            "post_logout_redirect_uri": {"type": "string"},
            "unauth_action": {"type": "string", "default": "auth", "enum": ["auth", "deny", "pass"]},
            "public_key": {"type": "string"},
            "use_jwks": {"type": "boolean", "default": false},
            "token_signing_alg_values_expected": {"type": "string"},
            "use_pkce": {"type": "boolean", "default": false},
            "par": {"type": "object"},
            "dpop": {"type": "object"}
        },
        "encrypt_fields": ["client_secret", "client_rsa_private_key", "dpop.private_key",
            "session.secret", "session.redis.password"],
        "required": ["client_id", "discovery"]
    });
    let props = s["properties"].as_object_mut().expect("an object");
    if let Value::Object(more) = more_properties() {
        props.extend(more);
    }
    props.insert("session".into(), session_schema());
    s
}

fn session_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "secret": {"type": "string", "minLength": 16,
                "description": "the key used for the encrypt and HMAC calculation"},
            "cookie_name": {"type": "string"},
            "cookie_path": {"type": "string"},
            "cookie_domain": {"type": "string"},
            "cookie_secure": {"type": "boolean"},
            "cookie_http_only": {"type": "boolean"},
            "cookie_same_site": {"type": "string", "enum": ["Strict", "Lax", "None", "Default"]},
            "idling_timeout": {"type": "integer"},
            "rolling_timeout": {"type": "integer"},
            "absolute_timeout": {"type": "integer"},
            "cookie": {"type": "object", "properties": {"lifetime": {"type": "integer"}}},
            "storage": {"type": "string", "enum": ["cookie", "redis"], "default": "cookie"},
            "redis": {"type": "object"}
        },
        "required": ["secret"],
        "additionalProperties": false
    })
}

fn more_properties() -> Value {
    json!({
            "set_access_token_header": {"type": "boolean", "default": true},
            "access_token_in_authorization_header": {"type": "boolean", "default": false},
            "set_id_token_header": {"type": "boolean", "default": true},
            "set_raw_id_token_header": {"type": "boolean", "default": false},
            "set_userinfo_header": {"type": "boolean", "default": true},
            "set_refresh_token_header": {"type": "boolean", "default": false},
            "proxy_opts": {"type": "object"},
            "authorization_params": {"type": "object"},
            "client_rsa_private_key": {"type": "string"},
            "client_rsa_private_key_id": {"type": "string"},
            "client_jwt_assertion_expires_in": {"type": "integer", "default": 60},
            "client_jwt_assertion_alg": {"type": "string",
                "enum": ["HS256", "HS512", "RS256", "RS512", "ES256", "ES512"]},
            "client_jwt_assertion_audience": {"type": "string"},
            "renew_access_token_on_expiry": {"type": "boolean", "default": true},
            "access_token_expires_in": {"type": "integer"},
            "refresh_session_interval": {"type": "integer"},
            "iat_slack": {"type": "integer", "default": 120},
            "accept_none_alg": {"type": "boolean", "default": false},
            "accept_unsupported_alg": {"type": "boolean", "default": true},
            "access_token_expires_leeway": {"type": "integer", "default": 0},
            "force_reauthorize": {"type": "boolean", "default": false},
            "use_nonce": {"type": "boolean", "default": false},
            "revoke_tokens_on_logout": {"type": "boolean", "default": false},
            "jwk_expires_in": {"type": "integer", "default": 86400},
            "jwt_verification_cache_ignore": {"type": "boolean", "default": false},
            "cache_segment": {"type": "string"},
            "introspection_interval": {"type": "integer", "default": 0},
            "introspection_expiry_claim": {"type": "string"},
            "introspection_addon_headers": {"type": "array", "minItems": 1,
                "items": {"type": "string", "pattern": "^[^:]+$"}},
            "required_scopes": {"type": "array", "items": {"type": "string"}},
            "claim_schema": {"type": "object"}
    })
}

fn d_scope() -> String {
    "openid".into()
}
fn yes() -> bool {
    true
}
fn d_timeout() -> u64 {
    3
}
fn d_basic() -> String {
    "client_secret_basic".into()
}
fn d_realm() -> String {
    "apisix".into()
}
fn d_logout() -> String {
    "/logout".into()
}
fn d_auth() -> String {
    "auth".into()
}
fn d_iat_slack() -> i64 {
    120
}
fn d_jwk_ttl() -> i64 {
    86400
}
fn d_aud() -> String {
    "aud".into()
}

#[derive(Deserialize, Default)]
struct SessionConf {
    secret: String,
    cookie_name: Option<String>,
    cookie_path: Option<String>,
    cookie_domain: Option<String>,
    cookie_secure: Option<bool>,
    cookie_http_only: Option<bool>,
    cookie_same_site: Option<String>,
    absolute_timeout: Option<i64>,
    cookie: Option<LegacyCookie>,
    storage: Option<String>,
}

#[derive(Deserialize, Default)]
struct LegacyCookie {
    lifetime: Option<i64>,
}

#[derive(Deserialize, Default)]
struct Issuers {
    valid_issuers: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct Audience {
    #[serde(default = "d_aud")]
    claim: String,
    #[serde(default)]
    required: bool,
    #[serde(default)]
    match_with_client_id: bool,
}

#[derive(Deserialize, Default)]
struct ClaimValidator {
    issuer: Option<Issuers>,
    audience: Option<Audience>,
}

#[derive(Deserialize)]
struct Conf {
    client_id: String,
    client_secret: Option<String>,
    discovery: String,
    #[serde(default = "d_scope")]
    scope: String,
    #[serde(default = "yes")]
    ssl_verify: bool,
    #[serde(default = "d_timeout")]
    timeout: u64,
    introspection_endpoint: Option<String>,
    #[serde(default = "d_basic")]
    introspection_endpoint_auth_method: String,
    #[serde(default = "d_basic")]
    token_endpoint_auth_method: String,
    #[serde(default)]
    bearer_only: bool,
    session: Option<SessionConf>,
    #[serde(default = "d_realm")]
    realm: String,
    claim_validator: Option<ClaimValidator>,
    #[serde(default = "d_logout")]
    logout_path: String,
    redirect_uri: Option<String>,
    post_logout_redirect_uri: Option<String>,
    #[serde(default = "d_auth")]
    unauth_action: String,
    public_key: Option<String>,
    #[serde(default)]
    use_jwks: bool,
    token_signing_alg_values_expected: Option<String>,
    #[serde(default)]
    use_pkce: bool,
    par: Option<Value>,
    dpop: Option<Value>,
    #[serde(default = "yes")]
    set_access_token_header: bool,
    #[serde(default)]
    access_token_in_authorization_header: bool,
    #[serde(default = "yes")]
    set_id_token_header: bool,
    #[serde(default)]
    set_raw_id_token_header: bool,
    #[serde(default = "yes")]
    set_userinfo_header: bool,
    #[serde(default)]
    set_refresh_token_header: bool,
    proxy_opts: Option<Value>,
    authorization_params: Option<serde_json::Map<String, Value>>,
    #[serde(default = "d_iat_slack")]
    iat_slack: i64,
    #[serde(default)]
    access_token_expires_leeway: i64,
    #[serde(default)]
    use_nonce: bool,
    #[serde(default = "yes")]
    renew_access_token_on_expiry: bool,
    #[serde(default = "d_jwk_ttl")]
    jwk_expires_in: i64,
    introspection_addon_headers: Option<Vec<String>>,
    required_scopes: Option<Vec<String>>,
    claim_schema: Option<Value>,
}

pub(super) fn check(v: &Value) -> Result<(), String> {
    compile_conf(v, false).map(drop)
}

pub(super) fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    Ok(Arc::new(OpenidConnect(Arc::new(compile_conf(v, true)?))))
}

fn client_auth_method(m: &str, what: &str) -> Result<bool, String> {
    match m {
        "client_secret_basic" => Ok(true),
        "client_secret_post" => Ok(false),
        other => Err(format!(
            "{what} {other:?} is not supported by Sluice (client_secret_basic, client_secret_post)"
        )),
    }
}

fn enabled(v: &Option<Value>) -> bool {
    v.as_ref()
        .and_then(|o| o.get("enabled"))
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

pub(super) fn compile_conf(v: &Value, warn: bool) -> Result<Inner, String> {
    // APISIX's check_schema: the session secret comes first, then the client secret's exemptions.
    if v.get("bearer_only").and_then(Value::as_bool) != Some(true) && v.get("session").is_none() {
        return Err("property \"session.secret\" is required when \"bearer_only\" is false".into());
    }
    let mut v = v.clone();
    if v.get("ssl_verify").and_then(Value::as_str) == Some("no") {
        v["ssl_verify"] = Value::Bool(false);
    }
    let c: Conf = crate::util::parse(&schema(), &v)?;
    let secret_optional = if c.bearer_only {
        c.public_key.is_some() || c.use_jwks
    } else {
        c.use_pkce
    };
    if !secret_optional && c.client_secret.is_none() {
        return Err("property \"client_secret\" is required".into());
    }
    for (flat, owner) in [
        ("use_par", "par.enabled"),
        ("pushed_authorization_request_endpoint", "par.endpoint"),
        ("use_dpop", "dpop.enabled"),
        ("dpop_private_key", "dpop.private_key"),
    ] {
        if v.get(flat).is_some() {
            return Err(format!(
                "property \"{flat}\" is not allowed, use \"{owner}\" instead"
            ));
        }
    }
    if enabled(&c.par) {
        return Err("par: Pushed Authorization Requests are not supported by Sluice".into());
    }
    if enabled(&c.dpop) {
        return Err("dpop: DPoP is not supported by Sluice".into());
    }
    if c.proxy_opts.is_some() {
        return Err(
            "proxy_opts: calling the provider through a proxy is not supported by Sluice".into(),
        );
    }
    let token_basic =
        client_auth_method(&c.token_endpoint_auth_method, "token_endpoint_auth_method")?;
    let intro_basic = client_auth_method(
        &c.introspection_endpoint_auth_method,
        "introspection_endpoint_auth_method",
    )?;
    if let Some(s) = &c.claim_schema {
        // The schema must compile (APISIX: "check claim_schema failed").
        if let Err(e) = sluice_model::schema::validate(s, &json!({})) {
            if e.contains("schema") && !e.contains("property") {
                return Err(format!("check claim_schema failed: {e}"));
            }
        }
    }
    let algs = match &c.token_signing_alg_values_expected {
        Some(a) => {
            let alg = Alg::parse(a)
                .filter(|x| token::ASYMMETRIC.contains(x))
                .ok_or_else(|| {
                    format!("token_signing_alg_values_expected: {a:?} is not supported")
                })?;
            vec![alg]
        }
        None => token::ASYMMETRIC.to_vec(),
    };
    let public_key = match &c.public_key {
        Some(pem) => Some(Key::public(pem).map_err(|e| format!("public_key: {e}"))?),
        None => None,
    };
    let timeout = Duration::from_secs(c.timeout);
    let provider = Provider::new(
        &c.discovery,
        c.ssl_verify,
        timeout,
        Duration::from_secs(c.jwk_expires_in.max(0) as u64),
    )?;
    let introspection = match &c.introspection_endpoint {
        Some(u) => Some(
            provider
                .target(u)
                .map_err(|e| format!("introspection_endpoint: {e}"))?,
        ),
        None => None,
    };
    let session = match &c.session {
        Some(s) => {
            if s.storage.as_deref() == Some("redis") {
                return Err("session.storage \"redis\" is not supported by Sluice".into());
            }
            let lifetime = s
                .absolute_timeout
                .or(s.cookie.as_ref().and_then(|c| c.lifetime))
                .unwrap_or(86400)
                .max(1) as u64;
            Some(Sealer::new(
                s.secret.as_bytes(),
                &session::CookieConf {
                    name: s.cookie_name.as_deref().unwrap_or("session"),
                    path: s.cookie_path.as_deref().unwrap_or("/"),
                    domain: s.cookie_domain.as_deref(),
                    secure: s.cookie_secure,
                    http_only: s.cookie_http_only.unwrap_or(true),
                    same_site: s.cookie_same_site.as_deref().unwrap_or("Lax"),
                    lifetime,
                },
            ))
        }
        None => None,
    };
    for (name, value) in [
        ("discovery", Some(&c.discovery)),
        ("introspection_endpoint", c.introspection_endpoint.as_ref()),
        ("redirect_uri", c.redirect_uri.as_ref()),
        (
            "post_logout_redirect_uri",
            c.post_logout_redirect_uri.as_ref(),
        ),
    ] {
        if warn && value.is_some_and(|u| u.to_ascii_lowercase().starts_with("http://")) {
            // APISIX's `core.utils.check_https`: a warning, not an error.
            tracing::warn!(
                plugin = NAME,
                field = name,
                "using {name} with no TLS is a security risk"
            );
        }
    }
    if warn && !c.ssl_verify {
        tracing::warn!(
            plugin = NAME,
            "ssl_verify is false: the provider's certificate is not checked"
        );
    }
    let redirect_path = c.redirect_uri.as_deref().map(|u| path_of(u).to_owned());
    let validator = c.claim_validator.unwrap_or_default();
    let aud = validator.audience;
    let authorization_params = c
        .authorization_params
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| {
            let v = match v {
                Value::String(s) => s,
                other => other.to_string(),
            };
            (k, v)
        })
        .collect();
    Ok(Inner {
        client_id: c.client_id,
        client_secret: c.client_secret,
        scope: c.scope,
        realm: c.realm,
        bearer_only: c.bearer_only,
        bearer_mode: c.bearer_only
            || c.introspection_endpoint.is_some()
            || public_key.is_some()
            || c.use_jwks,
        local: public_key.is_some() || c.use_jwks,
        public_key,
        algs,
        introspection,
        intro_basic,
        token_basic,
        redirect_uri: c.redirect_uri,
        redirect_path,
        logout_path: c.logout_path,
        post_logout: c.post_logout_redirect_uri,
        unauth: match c.unauth_action.as_str() {
            "pass" => Unauth::Pass,
            "deny" => Unauth::Deny,
            _ => Unauth::Auth,
        },
        session,
        set_access: c.set_access_token_header,
        access_in_auth: c.access_token_in_authorization_header,
        set_id: c.set_id_token_header,
        set_raw_id: c.set_raw_id_token_header,
        set_userinfo: c.set_userinfo_header,
        set_refresh: c.set_refresh_token_header,
        use_pkce: c.use_pkce,
        use_nonce: c.use_nonce,
        renew: c.renew_access_token_on_expiry,
        required_scopes: c.required_scopes.unwrap_or_default(),
        valid_issuers: validator.issuer.and_then(|i| i.valid_issuers),
        aud_claim: aud.as_ref().map_or_else(d_aud, |a| a.claim.clone()),
        aud_required: aud
            .as_ref()
            .is_some_and(|a| a.required || a.match_with_client_id),
        aud_match_client: aud.as_ref().is_some_and(|a| a.match_with_client_id),
        claim_schema: c.claim_schema,
        iat_slack: c.iat_slack.max(0) as u64,
        access_leeway: c.access_token_expires_leeway.max(0) as u64,
        authorization_params,
        addon_headers: c
            .introspection_addon_headers
            .unwrap_or_default()
            .into_iter()
            .map(|h| (h.to_ascii_lowercase(), h))
            .collect(),
        timeout,
        provider,
        verified: Default::default(),
    })
}
