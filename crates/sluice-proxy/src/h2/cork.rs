//! Write coalescing for an h2 connection: what the `h2` crate writes during one poll of the connection is
//! gathered and sent with one write when that poll ends, so the responses of every stream that finished in
//! the same scheduler tick share a syscall (and, over TLS, a record). The `h2` crate on its own flushes each
//! DATA frame larger than 256 bytes by itself: callgrind and /proc/PID/io showed one `writev` per response on
//! `h2load -m 8`, where HAProxy and nginx send several.
//!
//! The connection is only ever polled by [`Cork::drive`], which drains the gathered bytes after each poll, so a
//! `poll_flush` that returns without writing never strands bytes: they leave before the task next sleeps. Past
//! [`LIMIT`] gathered bytes a write waits for the socket, which is h2's back-pressure as without the cork.

use std::cell::RefCell;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Gathered bytes beyond which writes wait until the socket took them.
const LIMIT: usize = 64 * 1024;

struct State<S> {
    io: S,
    out: Vec<u8>,
    /// Bytes of `out` already written.
    sent: usize,
    /// A write error met while draining, reported to h2 on its next write.
    failed: Option<io::ErrorKind>,
}

/// The h2 connection's IO: reads go straight through, writes are gathered until [`Cork::drain`].
pub(crate) struct Corked<S>(Rc<RefCell<State<S>>>);

/// The connection loop's handle on the same IO, to drain what h2 wrote.
pub(crate) struct Cork<S>(Rc<RefCell<State<S>>>);

pub(crate) fn cork<S>(io: S) -> (Corked<S>, Cork<S>) {
    let st = Rc::new(RefCell::new(State {
        io,
        out: Vec::new(),
        sent: 0,
        failed: None,
    }));
    (Corked(st.clone()), Cork(st))
}

impl<S: AsyncWrite + Unpin> State<S> {
    /// Writes what was gathered; `Pending` while the socket is full (the task is woken when it drains).
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(kind) = self.failed {
            return Poll::Ready(Err(kind.into()));
        }
        while self.sent < self.out.len() {
            match Pin::new(&mut self.io).poll_write(cx, &self.out[self.sent..]) {
                Poll::Ready(Ok(0)) => {
                    self.failed = Some(io::ErrorKind::WriteZero);
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => self.sent += n,
                Poll::Ready(Err(e)) => {
                    self.failed = Some(e.kind());
                    return Poll::Ready(Err(e));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        self.out.clear();
        self.sent = 0;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn room(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(kind) = self.failed {
            return Poll::Ready(Err(kind.into()));
        }
        if self.out.len() - self.sent >= LIMIT {
            ready!(self.poll_drain(cx))?;
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> Cork<S> {
    /// Polls `f` (a poll of the h2 connection), then sends what it wrote.
    pub(crate) fn drive<T>(
        &self,
        cx: &mut Context<'_>,
        f: impl FnOnce(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        let r = f(cx);
        // An error stays recorded for h2's next write; a full socket wakes this task when it drains.
        let _ = self.0.borrow_mut().poll_drain(cx);
        r
    }
}

impl<S: AsyncWrite + Unpin> Cork<S> {
    /// Sends what is still gathered when the connection ends (an error's GOAWAY), for at most a second.
    pub(crate) async fn finish(&self) {
        let drain = std::future::poll_fn(|cx| self.0.borrow_mut().poll_drain(cx));
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), drain).await;
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Corked<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0.borrow_mut().io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Corked<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut st = self.0.borrow_mut();
        ready!(st.room(cx))?;
        st.out.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let mut st = self.0.borrow_mut();
        ready!(st.room(cx))?;
        let mut n = 0;
        for b in bufs {
            st.out.extend_from_slice(b);
            n += b.len();
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Deferred to the end of the connection's poll ([`Cork::drive`]).
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.0.borrow().failed {
            Some(kind) => Poll::Ready(Err(kind.into())),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut st = self.0.borrow_mut();
        ready!(st.poll_drain(cx))?;
        Pin::new(&mut st.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    /// A socket that counts writes and can be full or broken.
    #[derive(Default)]
    struct Sock {
        writes: usize,
        got: Vec<u8>,
        full: bool,
        broken: bool,
    }

    impl AsyncRead for Sock {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncWrite for Sock {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            b: &[u8],
        ) -> Poll<io::Result<usize>> {
            if self.broken {
                return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
            }
            if self.full {
                return Poll::Pending;
            }
            self.writes += 1;
            self.got.extend_from_slice(b);
            Poll::Ready(Ok(b.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn cx() -> Context<'static> {
        Context::from_waker(Waker::noop())
    }

    fn write(c: &mut Corked<Sock>, b: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(c).poll_write(&mut cx(), b)
    }

    #[test]
    fn what_one_poll_writes_leaves_in_one_write() {
        let (mut w, cork) = cork(Sock::default());
        let r = cork.drive(&mut cx(), |_| {
            for frame in [&b"HEADERS"[..], b"DATA-1", b"DATA-2"] {
                assert!(matches!(write(&mut w, frame), Poll::Ready(Ok(_))));
                assert!(matches!(
                    Pin::new(&mut w).poll_flush(&mut cx()),
                    Poll::Ready(Ok(()))
                ));
            }
            Poll::Ready(7)
        });
        assert_eq!(r, Poll::Ready(7));
        let st = cork.0.borrow();
        assert_eq!(
            (st.io.writes, &st.io.got[..]),
            (1, &b"HEADERSDATA-1DATA-2"[..])
        );
    }

    #[test]
    fn a_full_socket_holds_writes_past_the_limit_until_it_drains() {
        let (mut w, cork) = cork(Sock {
            full: true,
            ..Sock::default()
        });
        let chunk = vec![b'x'; 16 * 1024];
        let mut taken = 0;
        while let Poll::Ready(Ok(n)) = write(&mut w, &chunk) {
            taken += n;
            assert!(taken <= LIMIT + chunk.len(), "writes never wait");
        }
        assert!(taken >= LIMIT);
        cork.0.borrow_mut().io.full = false;
        let _ = cork.drive(&mut cx(), |_| Poll::Ready(()));
        assert_eq!(cork.0.borrow().io.got.len(), taken);
        assert!(matches!(write(&mut w, &chunk), Poll::Ready(Ok(_))));
    }

    #[test]
    fn a_write_error_reaches_h2_on_its_next_write_and_flush() {
        let (mut w, cork) = cork(Sock {
            broken: true,
            ..Sock::default()
        });
        assert!(matches!(write(&mut w, b"GOAWAY"), Poll::Ready(Ok(6))));
        let _ = cork.drive(&mut cx(), |_| Poll::Ready(()));
        assert!(matches!(write(&mut w, b"more"), Poll::Ready(Err(_))));
        assert!(matches!(
            Pin::new(&mut w).poll_flush(&mut cx()),
            Poll::Ready(Err(_))
        ));
    }
}
