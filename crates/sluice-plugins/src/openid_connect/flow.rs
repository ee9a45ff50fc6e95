//! openid-connect's authorization-code flow: the redirect to the provider, the callback (state, code exchange,
//! ID token, userinfo), the session's headers, access token renewal and logout.

use super::*;

impl Inner {
    /// The absolute redirect_uri sent to the provider.
    pub(super) fn redirect_uri_for(&self, ctx: &Ctx<'_>) -> String {
        let path = match &self.redirect_uri {
            Some(u) if u.contains("://") => return u.clone(),
            Some(u) => u.clone(),
            None => default_redirect(&ctx.req.uri),
        };
        let host = ctx.req.head.host_str().unwrap_or("localhost");
        format!("{}://{host}{path}", ctx.req.scheme)
    }

    pub(super) fn is_callback(&self, path: &str) -> bool {
        match &self.redirect_path {
            Some(p) => path == p,
            None => path.ends_with("/.apisix/redirect"),
        }
    }

    /// Sets the session's headers on the upstream request (or refuses it for missing scopes).
    pub(super) fn admit_session(&self, ctx: &mut Ctx<'_>, a: &Authed) -> Flow {
        if !self.required_scopes.is_empty() {
            if a.scope.is_none() {
                tracing::error!(
                    plugin = NAME,
                    "OIDC authentication failed: the scopes granted to the session are unknown"
                );
                return forbidden("required scopes not present");
            }
            if scopes_missing(&self.required_scopes, a.scope.as_deref()) {
                tracing::error!(
                    plugin = NAME,
                    "OIDC authentication failed: required scopes not present"
                );
                return forbidden(&format!(
                    "required scopes {} not present",
                    self.required_scopes.join(", ")
                ));
            }
        }
        if let Some(s) = &self.claim_schema {
            let data =
                json!({"user": a.user, "access_token": a.access_token, "id_token": a.id_token});
            if let Err(e) = sluice_model::schema::validate(s, &data) {
                tracing::error!(plugin = NAME, "OIDC claim validation failed: {e}");
                let mut r = error_page(401);
                let v = format!(
                    "Bearer realm=\"{}\", error=\"invalid_token\", error_description=\"{}\"",
                    self.realm,
                    e.replace(['"', '\\'], "'")
                );
                r.headers.push(header(b"WWW-Authenticate", v));
                return Flow::Respond(r);
            }
        }
        if let Some(t) = &a.access_token {
            self.access_header(ctx, t);
        }
        let e = &mut ctx.edits.set_headers;
        if self.set_id {
            e.push(header(
                b"X-ID-Token",
                base64_encode(a.id_token.to_string().as_bytes()),
            ));
        }
        if let (true, Some(u)) = (self.set_userinfo, &a.user) {
            e.push(header(
                b"X-Userinfo",
                base64_encode(u.to_string().as_bytes()),
            ));
        }
        if let (true, Some(r)) = (self.set_refresh, &a.refresh_token) {
            e.push(header(b"X-Refresh-Token", r.clone()));
        }
        if let (true, Some(r)) = (self.set_raw_id, &a.enc_id_token) {
            e.push(header(b"X-Raw-ID-Token", r.clone()));
        }
        Flow::Continue
    }

    /// The 302 to the authorization endpoint, with a new pending flow in the session cookie.
    fn start_auth(
        &self,
        disc: &Discovery,
        redirect_uri: &str,
        original_url: String,
        restarts: u8,
    ) -> Flow {
        let Some(sealer) = &self.session else {
            return Flow::Respond(error_page(500));
        };
        let Some(endpoint) = &disc.authorization_endpoint else {
            tracing::error!(
                plugin = NAME,
                "OIDC authentication failed: the provider has no authorization_endpoint"
            );
            return Flow::Respond(error_page(500));
        };
        let p = Pending {
            state: session::random_token(),
            nonce: self.use_nonce.then(session::random_token),
            verifier: self.use_pkce.then(session::random_token),
            original_url,
            restarts,
        };
        let mut q: Vec<(&str, String)> = vec![
            ("response_type", "code".into()),
            ("client_id", self.client_id.clone()),
            ("scope", self.scope.clone()),
            ("redirect_uri", redirect_uri.to_owned()),
            ("state", p.state.clone()),
        ];
        if let Some(n) = &p.nonce {
            q.push(("nonce", n.clone()));
        }
        if let Some(v) = &p.verifier {
            q.push(("code_challenge", session::pkce_challenge(v)));
            q.push(("code_challenge_method", "S256".into()));
        }
        for (k, v) in &self.authorization_params {
            q.push((k.as_str(), v.clone()));
        }
        let qs = form(&q.iter().map(|(k, v)| (*k, v.as_str())).collect::<Vec<_>>());
        let sep = if endpoint.contains('?') { '&' } else { '?' };
        let s = Session {
            exp: now() + sealer.lifetime,
            pending: Some(p),
            authed: None,
        };
        let Some(sealed) = sealer.seal(&s) else {
            return Flow::Respond(error_page(500));
        };
        Flow::Respond(redirect(
            &format!("{endpoint}{sep}{qs}"),
            Some(sealer.set_cookie(&sealed)),
        ))
    }

    fn logout(&self, disc: &Discovery, sess: Option<&Session>) -> Flow {
        let Some(sealer) = &self.session else {
            return Flow::Respond(error_page(500));
        };
        let clear = sealer.clear_cookie();
        let hint = sess
            .and_then(|s| s.authed.as_ref())
            .and_then(|a| a.enc_id_token.as_deref());
        if let Some(end) = &disc.end_session_endpoint {
            let mut q: Vec<(&str, &str)> = Vec::new();
            if let Some(h) = hint {
                q.push(("id_token_hint", h));
            }
            if let Some(p) = &self.post_logout {
                q.push(("post_logout_redirect_uri", p));
                q.push(("client_id", &self.client_id));
            }
            let loc = if q.is_empty() {
                end.clone()
            } else {
                let sep = if end.contains('?') { '&' } else { '?' };
                format!("{end}{sep}{}", form(&q))
            };
            return Flow::Respond(redirect(&loc, Some(clear)));
        }
        if let Some(p) = &self.post_logout {
            return Flow::Respond(redirect(p, Some(clear)));
        }
        let mut r = Response::status(200);
        r.headers
            .push(header(b"Content-Type", Bytes::from_static(b"text/html")));
        r.headers.push(header(b"Set-Cookie", clear));
        r.body = Bytes::from_static(b"<html><body><h2>Logged Out</h2></body></html>");
        Flow::Respond(r)
    }

    /// An ID token's signature and claims (OpenID Connect Core 3.1.3.7).
    async fn verify_id_token(
        &self,
        disc: &Discovery,
        id: &str,
        nonce: Option<&str>,
    ) -> Result<Value, String> {
        let issuers = [disc.issuer.clone()];
        let x = Expect {
            algs: &self.algs,
            issuers: &issuers,
            now: now(),
            leeway: 0,
        };
        let keys = self.provider.jwks(false).await?;
        let claims = match token::verify(id, Some(&keys.0), None, &x) {
            Err(Refused::UnknownKid) => {
                let keys = self.provider.jwks(true).await?;
                token::verify(id, Some(&keys.0), None, &x)
            }
            r => r,
        }
        .map_err(|e| format!("id_token: {}", refused_text(e)))?;
        let aud_ok = match claims.get("aud") {
            Some(Value::String(a)) => *a == self.client_id,
            Some(Value::Array(a)) => a.iter().any(|v| v.as_str() == Some(&self.client_id)),
            _ => false,
        };
        if !aud_ok {
            return Err("id_token: the audience does not hold client_id".into());
        }
        let iat = claims
            .get("iat")
            .and_then(Value::as_u64)
            .ok_or("id_token: no iat")?;
        if iat > now() + self.iat_slack {
            return Err("id_token: issued in the future".into());
        }
        if let Some(n) = nonce {
            if claims.get("nonce").and_then(Value::as_str) != Some(n) {
                return Err("id_token: nonce mismatch".into());
            }
        }
        Ok(claims)
    }

    /// A POST of `pairs` to the token endpoint with the client's authentication; its JSON answer when 200. `what`
    /// names the call in errors.
    async fn token_request(
        &self,
        t: &client_target::Target,
        mut pairs: Vec<(&'static str, String)>,
        what: &str,
    ) -> Result<Value, String> {
        let auth = self.client_auth(self.token_basic, &mut pairs);
        let body = form(
            &pairs
                .iter()
                .map(|(k, v)| (*k, v.as_str()))
                .collect::<Vec<_>>(),
        );
        let headers: Vec<(&str, &str)> =
            auth.iter().map(|a| ("Authorization", a.as_str())).collect();
        let ans = self
            .provider
            .call(t, "POST", &headers, Some(body.as_bytes()))
            .await
            .map_err(|e| format!("{what}: {e}"))?;
        let v = ans.json().unwrap_or_default();
        if ans.status != 200 {
            let err = v.get("error").and_then(Value::as_str).unwrap_or("");
            return Err(format!("{what} answered {} {err}", ans.status));
        }
        Ok(v)
    }

    /// Renews the session's access token with its refresh token; the renewed session and its sealed cookie.
    async fn refresh(&self, mut a: Authed) -> Result<(Authed, String), String> {
        let rt = a.refresh_token.clone().ok_or("no refresh token")?;
        let disc = self.provider.discovery().await?;
        let t = disc
            .token_endpoint
            .as_ref()
            .ok_or("the provider has no token_endpoint")?;
        let pairs = vec![
            ("grant_type", "refresh_token".to_owned()),
            ("refresh_token", rt),
        ];
        let v = self
            .token_request(t, pairs, "token endpoint (refresh)")
            .await?;
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        let now = now();
        a.access_token = header_safe(s("access_token"))?;
        if a.access_token.is_none() {
            return Err("the refresh answer has no access_token".into());
        }
        a.access_expires = v.get("expires_in").and_then(Value::as_u64).map(|e| now + e);
        if let Some(r) = header_safe(s("refresh_token"))? {
            a.refresh_token = Some(r);
        }
        if let Some(id) = header_safe(s("id_token"))? {
            a.id_token = self.verify_id_token(&disc, &id, None).await?;
            a.enc_id_token = Some(id);
        }
        if let Some(sc) = s("scope") {
            a.scope = Some(sc);
        }
        let sealer = self.session.as_ref().ok_or("no session")?;
        let sess = Session {
            exp: now + sealer.lifetime,
            pending: None,
            authed: Some(a.clone()),
        };
        let sealed = sealer
            .seal(&sess)
            .ok_or("the session is too large for a cookie")?;
        Ok((a, sealed))
    }

    /// The callback: code exchange, ID token validation, userinfo; the sealed session on success.
    async fn finish(
        &self,
        code: &str,
        pending: &Pending,
        redirect_uri: &str,
    ) -> Result<String, String> {
        let disc = self.provider.discovery().await?;
        let t = disc
            .token_endpoint
            .as_ref()
            .ok_or("the provider has no token_endpoint")?;
        let mut pairs = vec![
            ("grant_type", "authorization_code".to_owned()),
            ("code", code.to_owned()),
            ("redirect_uri", redirect_uri.to_owned()),
        ];
        if let Some(v) = &pending.verifier {
            pairs.push(("code_verifier", v.clone()));
        }
        let v = self.token_request(t, pairs, "token endpoint").await?;
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        let id = s("id_token").ok_or("the token answer has no id_token")?;
        let claims = self
            .verify_id_token(&disc, &id, pending.nonce.as_deref())
            .await?;
        let access = header_safe(s("access_token"))?;
        let refresh_token = header_safe(s("refresh_token"))?;
        let id = header_safe(Some(id))?.unwrap_or_default();
        let mut user = None;
        if let (Some(u), Some(at)) = (&disc.userinfo_endpoint, &access) {
            let bearer = format!("Bearer {at}");
            match self
                .provider
                .call(u, "GET", &[("Authorization", &bearer)], None)
                .await
            {
                Ok(a) if a.status == 200 => {
                    let info = a.json();
                    // OpenID Connect Core 5.3.2: the userinfo's sub must be the ID token's.
                    if info.as_ref().and_then(|i| i.get("sub")) != claims.get("sub") {
                        return Err("userinfo: sub does not match the id_token's".into());
                    }
                    user = info;
                }
                Ok(a) => tracing::error!(
                    plugin = NAME,
                    "userinfo: the provider answered {}",
                    a.status
                ),
                Err(e) => tracing::error!(plugin = NAME, "userinfo: {e}"),
            }
        }
        let sealer = self.session.as_ref().ok_or("no session")?;
        let now = now();
        let sess = Session {
            exp: now + sealer.lifetime,
            pending: None,
            authed: Some(Authed {
                access_expires: v.get("expires_in").and_then(Value::as_u64).map(|e| now + e),
                access_token: access,
                id_token: claims,
                enc_id_token: Some(id),
                refresh_token,
                user,
                scope: s("scope"),
            }),
        };
        sealer
            .seal(&sess)
            .ok_or_else(|| "the session is too large for a cookie".into())
    }
}

fn refused_text(r: Refused) -> String {
    match r {
        Refused::UnknownKid => "no key matches the token's kid".into(),
        Refused::Invalid(e) => e.into(),
    }
}

/// A token the provider returned, fit to go into a request header (no spaces or control bytes).
fn header_safe(t: Option<String>) -> Result<Option<String>, String> {
    match t {
        Some(v) if !v.bytes().all(|b| (0x21..0x7f).contains(&b)) => {
            Err("the provider returned a token with bytes that cannot go into a header".into())
        }
        t => Ok(t),
    }
}

/// APISIX's default redirect_uri: the request path with `/.apisix/redirect` appended.
pub(super) fn default_redirect(uri: &str) -> String {
    const SUFFIX: &str = "/.apisix/redirect";
    if uri.ends_with(SUFFIX) {
        uri.to_owned()
    } else {
        format!("{}{SUFFIX}", uri.strip_suffix('/').unwrap_or(uri))
    }
}

impl OpenidConnect {
    /// Runs `f` with the discovery document: at once when cached, else after fetching it.
    fn with_discovery(
        &self,
        ctx: &mut Ctx<'_>,
        fail_status: u16,
        f: impl for<'c> FnOnce(&Inner, &Discovery, &mut Ctx<'c>) -> Flow + 'static,
    ) -> Flow {
        if let Some(d) = self.0.provider.cached_discovery() {
            return f(&self.0, &d, ctx);
        }
        let me = self.0.clone();
        let budget = me.timeout + Duration::from_millis(500);
        ctx.await_io(
            async move {
                let r = me.provider.discovery().await;
                let f: Resume = Box::new(move |ctx: &mut Ctx<'_>| match r {
                    Ok(d) => f(&me, &d, ctx),
                    Err(e) => {
                        tracing::error!(plugin = NAME, "OIDC access discovery url failed: {e}");
                        Flow::Respond(error_page(fail_status))
                    }
                });
                f
            },
            budget,
            error_page(fail_status),
        );
        Flow::Continue
    }

    fn callback(&self, ctx: &mut Ctx<'_>, sess: Option<Session>) -> Flow {
        let me = &self.0;
        let state = query_arg(ctx, "state");
        let code = query_arg(ctx, "code");
        let Some(pending) = sess.as_ref().and_then(|s| s.pending.clone()) else {
            tracing::error!(
                plugin = NAME,
                "OIDC authentication failed: no authorization in progress for this callback"
            );
            return Flow::Respond(error_page(500));
        };
        if state.as_deref() != Some(pending.state.as_str()) {
            let sealer = me.session.as_ref().expect("session flows have a session");
            if pending.restarts < MAX_RESTARTS && ctx.req.head.method_str() == "GET" {
                tracing::warn!(plugin = NAME, "OIDC state mismatch (replayed or pruned callback), restarting the authentication flow");
                let mut s = sess.unwrap_or(Session {
                    exp: 0,
                    pending: None,
                    authed: None,
                });
                let url = pending.original_url.clone();
                s.pending = Some(Pending {
                    restarts: pending.restarts + 1,
                    ..pending
                });
                let cookie = sealer.seal(&s).map(|v| sealer.set_cookie(&v));
                return Flow::Respond(redirect(&url, cookie));
            }
            tracing::error!(plugin = NAME, "OIDC authentication failed: state from argument does not match state restored from session");
            return Flow::Respond(error_page(500));
        }
        let Some(code) = code else {
            let err = query_arg(ctx, "error").unwrap_or_default();
            tracing::error!(
                plugin = NAME,
                "OIDC authentication failed: unhandled request to the redirect_uri (error={err:?})"
            );
            return Flow::Respond(error_page(500));
        };
        let redirect_uri = me.redirect_uri_for(ctx);
        let me = self.0.clone();
        let budget = me.timeout * 5 + Duration::from_millis(500);
        ctx.await_io(
            async move {
                let r = me.finish(&code, &pending, &redirect_uri).await;
                let f: Resume = Box::new(move |_ctx: &mut Ctx<'_>| match r {
                    Ok(sealed) => {
                        let sealer = me.session.as_ref().expect("session flows have a session");
                        Flow::Respond(redirect(
                            &pending.original_url,
                            Some(sealer.set_cookie(&sealed)),
                        ))
                    }
                    Err(e) => {
                        tracing::error!(plugin = NAME, "OIDC authentication failed: {e}");
                        Flow::Respond(error_page(500))
                    }
                });
                f
            },
            budget,
            error_page(500),
        );
        Flow::Continue
    }

    /// An expired access token renewed before the request goes on; the renewed session cookie goes out with the
    /// response. When renewal fails the request is treated as having no session.
    fn renew(&self, ctx: &mut Ctx<'_>, a: Authed) -> Flow {
        let me = self.0.clone();
        let redirect_uri = me.redirect_uri_for(ctx);
        let original = format!(
            "{}://{}{}",
            ctx.req.scheme,
            ctx.req.head.host_str().unwrap_or("localhost"),
            ctx.req.request_uri()
        );
        let budget = me.timeout * 3 + Duration::from_millis(500);
        ctx.await_io(
            async move {
                let r = me.refresh(a).await;
                let f: Resume = Box::new(move |ctx: &mut Ctx<'_>| match r {
                    Ok((a, sealed)) => {
                        let sealer = me.session.as_ref().expect("session flows have a session");
                        ctx.resp
                            .add_headers
                            .push(header(b"Set-Cookie", sealer.set_cookie(&sealed)));
                        me.admit_session(ctx, &a)
                    }
                    Err(e) => {
                        tracing::error!(plugin = NAME, "OIDC access token renewal failed: {e}");
                        match (me.unauth, me.provider.cached_discovery()) {
                            (Unauth::Pass, _) => Flow::Continue,
                            (Unauth::Auth, Some(d)) => {
                                me.start_auth(&d, &redirect_uri, original, 0)
                            }
                            _ => Flow::Respond(error_page(401)),
                        }
                    }
                });
                f
            },
            budget,
            error_page(500),
        );
        Flow::Continue
    }

    pub(super) fn session_flow(&self, ctx: &mut Ctx<'_>) -> Flow {
        let me = &self.0;
        let Some(sealer) = &me.session else {
            return Flow::Respond(error_page(401));
        };
        let now = now();
        let sess = ctx
            .req
            .cookie(&sealer.name)
            .and_then(|c| sealer.open(c, now));
        if *ctx.req.uri == *me.logout_path {
            return self.with_discovery(ctx, 503, move |me, d, _| me.logout(d, sess.as_ref()));
        }
        if me.is_callback(&ctx.req.uri) {
            return self.callback(ctx, sess);
        }
        if let Some(a) = sess.as_ref().and_then(|s| s.authed.as_ref()) {
            let live = a.access_expires.is_none_or(|e| e > now + me.access_leeway);
            if live {
                return me.admit_session(ctx, a);
            }
            if me.renew && a.refresh_token.is_some() {
                return self.renew(ctx, a.clone());
            }
        }
        let xhr = ctx
            .req
            .head
            .header("x-requested-with")
            .is_some_and(|v| v == b"XMLHttpRequest");
        match me.unauth {
            Unauth::Pass => return Flow::Continue,
            Unauth::Deny => return Flow::Respond(error_page(401)),
            Unauth::Auth if xhr => return Flow::Respond(error_page(401)),
            Unauth::Auth => {}
        }
        let redirect_uri = me.redirect_uri_for(ctx);
        let original = format!(
            "{}://{}{}",
            ctx.req.scheme,
            ctx.req.head.host_str().unwrap_or("localhost"),
            ctx.req.request_uri()
        );
        let restarts = sess
            .as_ref()
            .and_then(|s| s.pending.as_ref())
            .map_or(0, |p| p.restarts);
        self.with_discovery(ctx, 500, move |me, d, _| {
            me.start_auth(d, &redirect_uri, original, restarts)
        })
    }
}
