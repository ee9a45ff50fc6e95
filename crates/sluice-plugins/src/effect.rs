//! Awaited IO from a request-phase hook: the general form of [`Ctx::add_delay`].
//!
//! Hooks stay synchronous. A hook that must call a service (forward-auth's auth server, an RPC, a key fetch) hands
//! the runner an [`Effect`]: a future doing the IO, a time budget, and the answer to give when the budget runs
//! out. The chain pauses after that hook exactly as it does for a delay; the proxy awaits the future on the
//! worker's runtime (never blocking the thread) while watching the client, and drops it (cancelling the IO) if
//! the client goes away. The future ends with a [`Resume`]: a closure that applies the result to the request
//! context (set headers, attach a consumer, or answer with [`Flow::Respond`]). The chain then runs that closure
//! as part of the hook that started it, so `_meta.error_response` and the short-circuit rules are unchanged, and
//! continues with the next hook.
//!
//! Routes whose plugins never start IO pay nothing: the runner's only extra work is one `Option` test on a field
//! that is `None`.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;

use crate::{Ctx, Flow, Response};

/// What an effect's IO produced, applied to the request context when the chain resumes.
pub type Resume = Box<dyn for<'c> FnOnce(&mut Ctx<'c>) -> Flow>;

/// IO a hook asked the proxy to await (see the module docs). Built with [`Ctx::await_io`].
pub struct Effect {
    fut: Pin<Box<dyn Future<Output = Resume>>>,
    budget: Duration,
    on_timeout: Response,
}

impl Effect {
    /// Awaits the IO within its budget: `Ok` with the closure to resume with, `Err` with the hook's timeout
    /// answer. Dropping the returned future before it ends cancels the IO.
    pub async fn run(self) -> Result<Resume, Response> {
        match tokio::time::timeout(self.budget, self.fut).await {
            Ok(resume) => Ok(resume),
            Err(_) => Err(self.on_timeout),
        }
    }

    pub fn budget(&self) -> Duration {
        self.budget
    }
}

impl std::fmt::Debug for Effect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Effect")
            .field("budget", &self.budget)
            .field("on_timeout", &self.on_timeout.status)
            .finish()
    }
}

/// The effect in flight for one request: set by a hook, taken by the proxy, resumed by the chain.
#[derive(Default)]
pub(crate) struct Pending {
    pub(crate) effect: Option<Effect>,
    /// The resuming closure, once the proxy has awaited the effect.
    pub(crate) resume: Option<Resume>,
    /// `_meta.error_response` of the hook that started the effect: it applies to the answer the resume gives.
    pub(crate) error_response: Option<Bytes>,
    /// A plugin's own upstream exchange.
    pub(crate) call: Option<UpstreamCall>,
}

impl Ctx<'_> {
    /// Starts IO the proxy awaits before the chain goes on (see the module docs). `budget` bounds the wait;
    /// past it the request is answered with `on_timeout` and the IO is dropped. A hook starts at most one effect.
    pub fn await_io<F>(&mut self, fut: F, budget: Duration, on_timeout: Response)
    where
        F: Future<Output = Resume> + 'static,
    {
        self.io.effect = Some(Effect {
            fut: Box::pin(fut),
            budget,
            on_timeout,
        });
    }

    /// The IO a hook started, if any (taken by the proxy, which awaits it and calls [`Ctx::resume_with`]).
    pub fn take_effect(&mut self) -> Option<Effect> {
        self.io.effect.take()
    }

    /// Hands the effect's result to the chain: the next [`crate::Chain::run_request`] applies it first.
    pub fn resume_with(&mut self, resume: Resume) {
        self.io.resume = Some(resume);
    }

    /// The effect's timeout answer, with the starting hook's `_meta.error_response` applied.
    pub fn effect_failed(&mut self, mut r: Response) -> Response {
        if let Some(body) = self.io.error_response.take() {
            r.body = body;
        }
        r
    }

    pub(crate) fn has_effect(&self) -> bool {
        self.io.effect.is_some()
    }
}

/// The route's timeouts, as an upstream call sees them.
#[derive(Debug, Clone, Copy)]
pub struct CallTimeouts {
    pub connect: Duration,
    pub send: Duration,
    pub read: Duration,
}

/// Why an upstream call failed: `sent` says whether the request may have reached the node (then it is not
/// retried on another one unless `retry`), `timeout` makes it a 504 rather than a 502. `retry`: the plugin
/// asks for another try although the call may have reached its node (it knows the call is safe to repeat); the
/// proxy makes it on a node not tried yet when there is one, else on any node again.
#[derive(Debug, Clone)]
pub struct CallFailure {
    pub sent: bool,
    pub timeout: bool,
    pub retry: bool,
    pub message: String,
}

/// A plugin that speaks the upstream's protocol itself (dubbo-proxy): given the node the route's balancer picked
/// and the route's timeouts, the call yields the HTTP answer. The proxy keeps the rest: node choice, retries on
/// other nodes, passive health, header_filter / body_filter / log, the access log.
pub type UpstreamCall = std::rc::Rc<
    dyn Fn(
        std::net::SocketAddr,
        CallTimeouts,
    ) -> Pin<Box<dyn Future<Output = Result<Response, CallFailure>>>>,
>;

impl Ctx<'_> {
    /// Takes over the upstream exchange of this request (see [`UpstreamCall`]). Set in a request phase.
    pub fn call_upstream(&mut self, call: UpstreamCall) {
        self.io.call = Some(call);
    }

    /// The upstream exchange a plugin took over, if any (taken by the proxy).
    pub fn take_upstream_call(&mut self) -> Option<UpstreamCall> {
        self.io.call.take()
    }
}
