//! A plugin's own HTTP call out, for plugins outside this crate (proxy-wasm's `proxy_http_call`): forward-auth's
//! client ([`crate::forward_auth`]'s strict codec, TLS and body cap), one request per call. The future is not
//! `Send`: it runs on the worker that awaits it, inside [`crate::Ctx::await_io`].

use bytes::Bytes;

/// What the called service answered.
#[derive(Debug, Clone)]
pub struct CallAnswer {
    pub status: u16,
    pub headers: Vec<(Bytes, Bytes)>,
    pub body: Bytes,
}

/// Whether `b` may stand in a header name (an RFC 9110 token).
fn token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Sends one request to `uri` (`http(s)://host[:port][/path][?query]`) and reads the answer (body up to 1 MiB).
/// `headers` must not carry framing (`Content-Length`, `Transfer-Encoding`, `Connection`, `Host`: the call sets
/// them); a name that is not a token or a value with CR, LF or NUL is refused before anything is sent.
pub async fn call(
    uri: &str,
    method: &str,
    headers: &[(Bytes, Bytes)],
    body: &[u8],
) -> Result<CallAnswer, String> {
    let target = crate::forward_auth::client::Target::parse(uri, true)?;
    if method.is_empty() || !method.bytes().all(token) {
        return Err(format!("bad method {method:?}"));
    }
    let mut req = Vec::with_capacity(256 + body.len());
    req.extend_from_slice(method.as_bytes());
    req.push(b' ');
    req.extend_from_slice(target.path.as_bytes());
    req.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    req.extend_from_slice(target.host_header.as_bytes());
    req.extend_from_slice(b"\r\n");
    for (n, v) in headers {
        if n.is_empty() || !n.iter().copied().all(token) {
            return Err(format!("bad header name {:?}", String::from_utf8_lossy(n)));
        }
        if v.iter().any(|&b| b == b'\r' || b == b'\n' || b == 0) {
            return Err(format!(
                "bad value for header {}",
                String::from_utf8_lossy(n)
            ));
        }
        let framing = ["content-length", "transfer-encoding", "connection", "host"];
        if framing.iter().any(|f| n.eq_ignore_ascii_case(f.as_bytes())) {
            continue;
        }
        req.extend_from_slice(n);
        req.extend_from_slice(b": ");
        req.extend_from_slice(v);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(
        format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    req.extend_from_slice(body);
    let answer = crate::forward_auth::client::call(&target, &req, None).await?;
    let h = &answer.head;
    let headers = h
        .headers
        .iter()
        .map(|s| {
            (
                Bytes::copy_from_slice(h.slice(s.name)),
                Bytes::copy_from_slice(h.slice(s.value)),
            )
        })
        .collect();
    Ok(CallAnswer {
        status: h.status,
        headers,
        body: answer.body,
    })
}
