//! `sluice mock`: the upstream used by `sluice bench` and by integration tests. It answers every
//! HTTP/1.1 request with a fixed body after a configurable delay, with keep-alive and pipelining,
//! on N threads (one current-thread tokio runtime per thread, SO_REUSEPORT listeners) so that it is
//! never the bottleneck. HTTP/2 cleartext (prior knowledge) is served too, detected by its preface.
//! It deliberately has no routing beyond `/status/NNN` and no TLS.

mod conn;
mod h2c;
pub use conn::chunked_len;
pub mod delay;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
pub use delay::Delay;

/// Command-line arguments of `sluice mock`.
#[derive(clap::Args, Debug, Clone)]
pub struct MockArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:1980")]
    pub listen: SocketAddr,
    /// Response body size in bytes.
    #[arg(long, default_value_t = 1024)]
    pub body_size: usize,
    /// Delay before each response: `20ms`, `uniform:10ms-30ms` or `exp:20ms` (mean).
    #[arg(long, default_value = "0ms")]
    pub delay: Delay,
    /// Number of threads (each with its own runtime and SO_REUSEPORT listener).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Status code of the default response.
    #[arg(long, default_value_t = 200)]
    pub status: u16,
}

/// Immutable configuration shared by all connections; the default response is encoded once.
#[derive(Debug)]
pub struct MockConfig {
    /// Body size of every response.
    pub body_size: usize,
    /// Delay distribution.
    pub delay: Delay,
    /// Default status code.
    pub status: u16,
    /// The prebuilt keep-alive response with `status`.
    pub response: Bytes,
    body: Bytes,
    seeds: AtomicU64,
}

impl MockConfig {
    /// Builds the config and encodes the default response.
    pub fn new(body_size: usize, delay: Delay, status: u16) -> Self {
        let body = Bytes::from(vec![b'x'; body_size]);
        let mut cfg = MockConfig {
            body_size,
            delay,
            status,
            response: Bytes::new(),
            body,
            seeds: AtomicU64::new(0x5EED),
        };
        cfg.response = cfg.build_response(status, false);
        cfg
    }

    /// Encodes a response with `status`; used for the default one and for `/status/NNN`.
    pub fn build_response(&self, status: u16, close: bool) -> Bytes {
        let conn = if close { "Connection: close\r\n" } else { "" };
        let mut out = format!(
            "HTTP/1.1 {status} {}\r\nServer: sluice-mock\r\nContent-Type: text/plain\r\n{conn}Content-Length: {}\r\n\r\n",
            reason(status),
            self.body.len()
        )
        .into_bytes();
        out.extend_from_slice(&self.body);
        Bytes::from(out)
    }
}

impl From<&MockArgs> for MockConfig {
    fn from(a: &MockArgs) -> Self {
        MockConfig::new(a.body_size, a.delay, a.status)
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// Accepts connections on `listener` for ever and serves each on its own task of the current runtime.
pub async fn serve(listener: tokio::net::TcpListener, cfg: Arc<MockConfig>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let seed = cfg.seeds.fetch_add(0x9E37_79B9, Ordering::Relaxed);
                tokio::spawn(conn::handle(stream, cfg.clone(), seed));
            }
            // EMFILE and friends: back off briefly instead of spinning.
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
        }
    }
}

/// Binds a non-blocking SO_REUSEPORT listener (so several threads can share one port).
pub fn bind_reuseport(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    sock.set_reuse_address(true)?;
    sock.set_reuse_port(true)?;
    sock.set_nonblocking(true)?;
    sock.bind(&addr.into())?;
    sock.listen(4096)?;
    Ok(sock.into())
}

/// Runs the mock until the process is killed. Blocks the calling thread.
pub fn run(args: MockArgs) -> std::io::Result<()> {
    let cfg = Arc::new(MockConfig::from(&args));
    let first = bind_reuseport(args.listen)?;
    // With port 0 the later listeners must join the port the first one got.
    let addr = first.local_addr()?;
    let mut listeners = vec![first];
    for _ in 1..args.threads.max(1) {
        listeners.push(bind_reuseport(addr)?);
    }
    eprintln!(
        "sluice mock listening on {addr} (threads {}, body {} B, delay {}, status {})",
        listeners.len(),
        args.body_size,
        args.delay,
        args.status
    );
    let mut handles = Vec::new();
    for (i, l) in listeners.into_iter().enumerate() {
        let cfg = cfg.clone();
        let h = std::thread::Builder::new()
            .name(format!("mock-{i}"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(l)?;
                    serve(listener, cfg).await;
                    Ok::<(), std::io::Error>(())
                })
            })?;
        handles.push(h);
    }
    for h in handles {
        match h.join() {
            Ok(r) => r?,
            Err(_) => return Err(std::io::Error::other("mock thread panicked")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
