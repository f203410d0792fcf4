//! A fault-injecting HTTP proxy, to sit between a sidecar and Conductor or lakeFS and break
//! the world around it on purpose: drop a request unsent, forward a request and drop its
//! answer, answer an error status itself, reset a connection in the middle of an upload or a
//! download, delay a call, or hold it until the test releases it.
//!
//! Rules match on the method, a substring of the path (query included) and optionally a
//! substring of the request body, and apply a given number of times or always; the first rule
//! that matches wins. Every request is logged with when it came and what the proxy did to it.
//! Anything without a matching rule is forwarded as it is.

use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use http_body_util::{BodyExt, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use tokio::sync::watch;

/// What to do with a matching request.
#[derive(Clone, Debug)]
pub enum Fault {
    /// Close the connection without forwarding: the call never reached the server.
    DropRequest,
    /// Forward, let the server act, then close the connection without answering.
    DropResponse,
    /// Answer this status (with a short text body) without forwarding.
    Status(u16),
    /// Answer as an S3 server refusing a request: this status and an XML error with this
    /// code (`SlowDown`, `InternalError`, ...), without forwarding.
    S3Error(u16, &'static str),
    /// Forward the request but cut its body after this many bytes, then close.
    ResetUpload { after: usize },
    /// Forward the request with the byte at this offset of its body changed (a transfer
    /// that corrupts data without breaking it).
    CorruptUpload { at: usize },
    /// Forward, pass the answer's headers and this many bytes of its body, then reset.
    ResetDownload { after: usize },
    /// Forward after this delay.
    Delay(Duration),
    /// Forward once the hold of this name is released; close unsent if it is dropped.
    Hold(String),
}

/// Where a hold stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HoldState {
    Holding,
    Released,
    Dropped,
}

impl Fault {
    fn name(&self) -> String {
        match self {
            Fault::DropRequest => "drop-request".into(),
            Fault::DropResponse => "drop-response".into(),
            Fault::Status(code) => format!("status-{code}"),
            Fault::S3Error(status, code) => format!("s3-{status}-{code}"),
            Fault::ResetUpload { after } => format!("reset-upload-after-{after}"),
            Fault::CorruptUpload { at } => format!("corrupt-upload-at-{at}"),
            Fault::ResetDownload { after } => format!("reset-download-after-{after}"),
            Fault::Delay(d) => format!("delay-{}ms", d.as_millis()),
            Fault::Hold(name) => format!("hold-{name}"),
        }
    }
}

/// One request the proxy saw and what it did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub method: String,
    pub path: String,
    /// When the request reached the proxy.
    pub at: Instant,
    /// The fault applied, or `None` when it was forwarded untouched.
    pub fault: Option<String>,
    /// The request's W3C `traceparent` header, when it had one.
    pub traceparent: Option<String>,
}

struct Rule {
    method: Option<String>,
    path: String,
    /// A substring the request body must contain (the body is read first when one is set).
    body: Option<String>,
    fault: Fault,
    /// Applications left; `None` is always.
    left: Option<usize>,
}

#[derive(Default)]
struct State {
    rules: Vec<Rule>,
    seen: Vec<Seen>,
    holds: Vec<(String, watch::Sender<HoldState>)>,
}

/// The proxy: `url` replaces the server's base URL (same path prefix).
pub struct FaultProxy {
    pub url: String,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

type ProxyBody = UnsyncBoxBody<Bytes, std::io::Error>;

/// An aborted exchange: hyper closes the connection without an answer.
#[derive(Debug)]
struct Abort(&'static str);

impl std::fmt::Display for Abort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Abort {}

impl FaultProxy {
    /// Listen on 127.0.0.1 and forward to `upstream` (`scheme://host:port[/prefix]`); the proxy's
    /// `url` keeps the prefix, so it stands in for `upstream` everywhere.
    pub async fn start(upstream: &str) -> Result<Self> {
        Self::start_with(upstream, false).await
    }

    /// [`start`](Self::start), passing the client's `Host` header on as it came: a request
    /// signed for the proxy's address (an S3 URL lakeFS presigned for it) still verifies
    /// upstream.
    pub async fn start_keeping_host(upstream: &str) -> Result<Self> {
        Self::start_with(upstream, true).await
    }

    async fn start_with(upstream: &str, keep_host: bool) -> Result<Self> {
        let parsed = reqwest::Url::parse(upstream).context("the upstream URL")?;
        let origin = parsed.origin().ascii_serialization();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let state = Arc::new(Mutex::new(State::default()));
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()?;
        let shared = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (state, http, origin) = (shared.clone(), http.clone(), origin.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        exchange(
                            state.clone(),
                            http.clone(),
                            origin.clone(),
                            keep_host,
                            request,
                        )
                    });
                    // An aborted exchange ends the connection; that is the point.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(true)
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        let url = format!(
            "http://127.0.0.1:{port}{}",
            parsed.path().trim_end_matches('/')
        );
        Ok(Self { url, state, task })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Apply `fault` to the next `times` requests (`None`: every request) whose method is
    /// `method` (any when `None`) and whose path contains `path`.
    pub fn inject(&self, method: Option<&str>, path: &str, fault: Fault, times: Option<usize>) {
        self.add_rule(method, path, None, fault, times);
    }

    /// [`inject`](Self::inject) for requests whose body also contains `body` (small bodies
    /// only: the proxy reads a body whole before choosing when a rule looks at it).
    pub fn inject_with_body(
        &self,
        method: Option<&str>,
        path: &str,
        body: &str,
        fault: Fault,
        times: Option<usize>,
    ) {
        self.add_rule(method, path, Some(body), fault, times);
    }

    fn add_rule(
        &self,
        method: Option<&str>,
        path: &str,
        body: Option<&str>,
        fault: Fault,
        times: Option<usize>,
    ) {
        let mut state = self.state();
        if let Fault::Hold(name) = &fault {
            // A hold of this name that was released or dropped before holds again.
            state
                .holds
                .retain(|(n, h)| n != name || *h.borrow() == HoldState::Holding);
            if !state.holds.iter().any(|(n, _)| n == name) {
                state
                    .holds
                    .push((name.clone(), watch::channel(HoldState::Holding).0));
            }
        }
        state.rules.push(Rule {
            method: method.map(str::to_owned),
            path: path.to_owned(),
            body: body.map(str::to_owned),
            fault,
            left: times,
        });
    }

    /// Let the calls held under `name` go on (and any later ones).
    pub fn release(&self, name: &str) {
        self.settle(name, HoldState::Released);
    }

    /// Close the calls held under `name` (and any later ones) unsent, as if their client had
    /// died with them in flight before they reached the server.
    pub fn drop_held(&self, name: &str) {
        self.settle(name, HoldState::Dropped);
    }

    fn settle(&self, name: &str, to: HoldState) {
        for (n, hold) in &self.state().holds {
            if n == name {
                hold.send_replace(to);
            }
        }
    }

    /// Whether a call is held under `name` now or was held before.
    pub fn held(&self, name: &str) -> bool {
        let fault = format!("hold-{name}");
        self.state()
            .seen
            .iter()
            .any(|s| s.fault.as_deref() == Some(&*fault))
    }

    /// Wait until a call is held under `name`, at most `limit`; whether one was.
    pub async fn until_held(&self, name: &str, limit: Duration) -> bool {
        let started = Instant::now();
        while !self.held(name) {
            if started.elapsed() > limit {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        true
    }

    /// Remove every rule, release every hold and forget the requests seen.
    pub fn clear(&self) {
        let mut state = self.state();
        state.rules.clear();
        state.seen.clear();
        for (_, hold) in &state.holds {
            if *hold.borrow() == HoldState::Holding {
                hold.send_replace(HoldState::Released);
            }
        }
        state.holds.clear();
    }

    /// Every request seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.state().seen.clone()
    }

    /// The requests a fault was applied to.
    pub fn faulted(&self) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.fault.is_some())
            .collect()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The first matching rule's fault (its use counted), and the request logged.
fn choose(
    state: &Mutex<State>,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    at: Instant,
    traceparent: Option<String>,
) -> (Option<Fault>, Option<watch::Receiver<HoldState>>) {
    let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
    let mut chosen = None;
    for rule in &mut state.rules {
        let matches = rule.method.as_deref().is_none_or(|m| m == method)
            && path.contains(&rule.path)
            && rule.left != Some(0)
            && rule.body.as_ref().is_none_or(|wanted| {
                body.is_some_and(|b| String::from_utf8_lossy(b).contains(wanted.as_str()))
            });
        if matches {
            if let Some(left) = &mut rule.left {
                *left -= 1;
            }
            chosen = Some(rule.fault.clone());
            break;
        }
    }
    let hold = match &chosen {
        Some(Fault::Hold(name)) => state
            .holds
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, h)| h.subscribe()),
        _ => None,
    };
    state.seen.push(Seen {
        method: method.to_owned(),
        path: path.to_owned(),
        at,
        fault: chosen.as_ref().map(Fault::name),
        traceparent,
    });
    (chosen, hold)
}

async fn exchange(
    state: Arc<Mutex<State>>,
    http: reqwest::Client,
    origin: String,
    keep_host: bool,
    request: Request<Incoming>,
) -> Result<Response<ProxyBody>, Abort> {
    let method = request.method().as_str().to_owned();
    let path = request
        .uri()
        .path_and_query()
        .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned());
    let at = Instant::now();
    let (parts, body) = request.into_parts();
    // Read the body first only when a rule looks at it for this call.
    let looks_at_body = {
        let state = state.lock().unwrap_or_else(PoisonError::into_inner);
        state.rules.iter().any(|r| {
            r.body.is_some()
                && r.left != Some(0)
                && r.method.as_deref().is_none_or(|m| m == method)
                && path.contains(&r.path)
        })
    };
    let (buffered, body) = if looks_at_body {
        let bytes = body
            .collect()
            .await
            .map_err(|_| Abort("the request body could not be read"))?
            .to_bytes();
        (Some(bytes), None)
    } else {
        (None, Some(body))
    };
    let traceparent = parts
        .headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let (fault, hold) = choose(&state, &method, &path, buffered.as_deref(), at, traceparent);
    match &fault {
        Some(Fault::DropRequest) => return Err(Abort("dropped the request unsent")),
        Some(Fault::Status(code)) => {
            let status =
                hyper::StatusCode::from_u16(*code).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
            let body = format!("{{\"message\": \"fault proxy: {code}\"}}");
            return Ok(Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(full(body))
                .unwrap_or_else(|_| Response::new(full(String::new()))));
        }
        Some(Fault::S3Error(code, name)) => {
            let status =
                hyper::StatusCode::from_u16(*code).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
            let body = format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{name}</Code>\
                 <Message>fault proxy: {name}</Message></Error>"
            );
            return Ok(Response::builder()
                .status(status)
                .header("content-type", "application/xml")
                .body(full(body))
                .unwrap_or_else(|_| Response::new(full(String::new()))));
        }
        Some(Fault::Delay(d)) => tokio::time::sleep(*d).await,
        Some(Fault::Hold(_)) => {
            if let Some(mut hold) = hold {
                let settled = hold
                    .wait_for(|h| *h != HoldState::Holding)
                    .await
                    .map(|h| *h);
                if matches!(settled, Ok(HoldState::Dropped)) {
                    return Err(Abort("dropped the held request unsent"));
                }
            }
        }
        _ => {}
    }

    let mut forward = http.request(parts.method.clone(), format!("{origin}{path}"));
    for (name, value) in &parts.headers {
        let hop = matches!(name.as_str(), "connection" | "transfer-encoding");
        if !hop && (keep_host || name.as_str() != "host") {
            forward = forward.header(name, value);
        }
    }
    let upload: futures_util::stream::BoxStream<'static, std::io::Result<Bytes>> = match body {
        Some(body) => body
            .into_data_stream()
            .map_err(std::io::Error::other)
            .boxed(),
        None => futures_util::stream::iter(buffered.map(Ok)).boxed(),
    };
    let upload = match fault {
        Some(Fault::ResetUpload { after }) => cut(upload, after).boxed(),
        Some(Fault::CorruptUpload { at }) => corrupt(upload, at).boxed(),
        _ => upload,
    };
    let answer = forward
        .body(reqwest::Body::wrap_stream(upload))
        .send()
        .await
        .map_err(|_| Abort("the upstream call failed"))?;
    if matches!(fault, Some(Fault::ResetUpload { .. })) {
        return Err(Abort("reset the upload"));
    }
    if matches!(fault, Some(Fault::DropResponse)) {
        // Let the server finish what it does with the call, then say nothing.
        let _ = answer.bytes().await;
        return Err(Abort("dropped the answer"));
    }
    let mut response = Response::builder().status(answer.status().as_u16());
    for (name, value) in answer.headers() {
        if !matches!(name.as_str(), "connection" | "transfer-encoding") {
            response = response.header(name.as_str(), value.as_bytes());
        }
    }
    let download = answer.bytes_stream().map_err(std::io::Error::other);
    let download: futures_util::stream::BoxStream<'static, std::io::Result<Bytes>> = match fault {
        Some(Fault::ResetDownload { after }) => cut(download, after).boxed(),
        _ => download.boxed(),
    };
    let body = StreamBody::new(download.map_ok(Frame::data));
    response
        .body(BodyExt::boxed_unsync(body))
        .map_err(|_| Abort("the upstream answer could not be passed on"))
}

fn full(text: String) -> ProxyBody {
    http_body_util::Full::new(Bytes::from(text))
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

/// `stream`'s first `after` bytes, then an error (which resets the connection).
/// `stream` with the byte at offset `at` flipped (unchanged when it is shorter).
fn corrupt(
    stream: impl futures_util::Stream<Item = std::io::Result<Bytes>> + Send + 'static,
    at: usize,
) -> impl futures_util::Stream<Item = std::io::Result<Bytes>> + Send + 'static {
    let mut offset = 0usize;
    stream.map_ok(move |chunk| {
        let start = offset;
        offset += chunk.len();
        if (start..offset).contains(&at) {
            let mut bytes = chunk.to_vec();
            bytes[at - start] ^= 0xff;
            Bytes::from(bytes)
        } else {
            chunk
        }
    })
}

fn cut(
    stream: impl futures_util::Stream<Item = std::io::Result<Bytes>> + Send + 'static,
    after: usize,
) -> impl futures_util::Stream<Item = std::io::Result<Bytes>> + Send + 'static {
    futures_util::stream::unfold(
        (stream.boxed(), after, false),
        |(mut stream, left, done)| async move {
            if done {
                return None;
            }
            if left == 0 {
                // Let what passed reach the other side first, so the reset is mid-stream.
                tokio::time::sleep(Duration::from_millis(50)).await;
                return Some((
                    Err(std::io::Error::other("fault proxy: connection reset")),
                    (stream, 0, true),
                ));
            }
            match stream.next().await {
                Some(Ok(mut chunk)) => {
                    if chunk.len() > left {
                        chunk.truncate(left);
                    }
                    let left = left - chunk.len();
                    Some((Ok(chunk), (stream, left, false)))
                }
                Some(Err(e)) => Some((Err(e), (stream, 0, true))),
                // The whole body was shorter than the cut: reset at its end.
                None => Some((
                    Err(std::io::Error::other("fault proxy: connection reset")),
                    (stream, 0, true),
                )),
            }
        },
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A server that answers `/data` with 64 KiB and counts every call it gets.
    async fn upstream() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let app = axum::Router::new().fallback(move |body: Bytes| {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                if body.is_empty() {
                    vec![b'x'; 64 * 1024]
                } else {
                    format!("got {} bytes", body.len()).into_bytes()
                }
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/api", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (url, calls)
    }

    #[tokio::test]
    async fn each_fault_does_what_it_says() {
        use std::sync::atomic::Ordering;
        let (upstream, calls) = upstream().await;
        let proxy = FaultProxy::start(&upstream).await.unwrap();
        assert!(proxy.url.ends_with("/api"));
        let client = reqwest::Client::new();
        let get = |path: &str| client.get(format!("{}{path}", proxy.url)).send();

        assert_eq!(
            get("/data").await.unwrap().bytes().await.unwrap().len(),
            65536
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1);

        proxy.inject(Some("GET"), "/data", Fault::DropRequest, Some(1));
        assert!(get("/data").await.is_err(), "dropped unsent");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "the server never saw it");

        proxy.inject(None, "/data", Fault::DropResponse, Some(1));
        assert!(get("/data").await.is_err(), "answer dropped");
        assert_eq!(calls.load(Ordering::SeqCst), 2, "the server acted");

        proxy.inject(None, "/data", Fault::Status(423), Some(1));
        assert_eq!(get("/data").await.unwrap().status(), 423);
        assert_eq!(calls.load(Ordering::SeqCst), 2);

        proxy.inject(None, "/data", Fault::ResetDownload { after: 1000 }, Some(1));
        let cut = get("/data").await.unwrap().bytes().await;
        assert!(cut.is_err(), "the download is reset mid-body");

        proxy.inject(
            Some("POST"),
            "/up",
            Fault::ResetUpload { after: 10 },
            Some(1),
        );
        let up = client
            .post(format!("{}/up", proxy.url))
            .body(vec![b'y'; 100_000])
            .send()
            .await;
        assert!(up.is_err(), "the upload is reset");
        let whole = client
            .post(format!("{}/up", proxy.url))
            .body(vec![b'y'; 100_000])
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(whole, "got 100000 bytes", "the rule applied once");

        proxy.inject(None, "/held", Fault::Hold("h".into()), None);
        let held = tokio::spawn(get("/held"));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!held.is_finished(), "held until released");
        proxy.release("h");
        assert!(held.await.unwrap().unwrap().status().is_success());

        proxy.inject(None, "/dropped", Fault::Hold("d".into()), None);
        let dropped = tokio::spawn(get("/dropped"));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(proxy.held("d") && !dropped.is_finished());
        let before = calls.load(Ordering::SeqCst);
        proxy.drop_held("d");
        assert!(dropped.await.unwrap().is_err(), "closed unsent");
        assert_eq!(
            calls.load(Ordering::SeqCst),
            before,
            "the server never saw it"
        );

        proxy.inject_with_body(Some("POST"), "/up", "\"lease\"", Fault::Status(409), None);
        let post = |body: &'static str| client.post(format!("{}/up", proxy.url)).body(body).send();
        assert_eq!(post("{\"lease\": 1}").await.unwrap().status(), 409);
        let other = post("{\"done\": 1}").await.unwrap();
        assert_eq!(
            other.text().await.unwrap(),
            "got 11 bytes",
            "forwarded whole"
        );

        let faults: Vec<String> = proxy
            .faulted()
            .into_iter()
            .filter_map(|s| s.fault)
            .collect();
        assert_eq!(
            faults,
            [
                "drop-request",
                "drop-response",
                "status-423",
                "reset-download-after-1000",
                "reset-upload-after-10",
                "hold-h",
                "hold-d",
                "status-409"
            ]
        );
    }
}
