//! Shared harness for integration tests: an in-process simulator and tokentap in front
//! of it, both on `127.0.0.1:0`, plus a client and a scraper for `/metrics`.
//!
//! Nothing here sleeps to wait for a server: listeners are bound before their addresses
//! are handed out, and conditions on metrics are polled with a deadline.

pub mod access_log;
mod process;
pub use process::TokentapProcess;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokentap::config::{Config, Overrides};
use tokentap::Server;
use tokentap_sim::{Sim, SimConfig};
use tokio::sync::watch;

/// The tests that assert on this process's RSS (in `bad_input` and `cardinality`) take
/// this for writing and run alone among the tests that take it; the other tests of those
/// two modules, which move mebibytes or label values by the thousand, take it for reading.
/// One lock for both modules, since they share one process.
pub static MEMORY: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// A running simulator.
pub struct SimHandle {
    pub addr: SocketAddr,
    pub open_streams: Arc<AtomicU64>,
    stop: watch::Sender<bool>,
}

impl SimHandle {
    pub async fn start(config: SimConfig) -> SimHandle {
        let sim = Sim::bind("127.0.0.1:0".parse().unwrap(), config)
            .await
            .expect("bind sim");
        let addr = sim.local_addr();
        let open_streams = sim.open_streams();
        let (stop, rx) = watch::channel(false);
        tokio::spawn(sim.run(stopped(rx)));
        SimHandle {
            addr,
            open_streams,
            stop,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn open_streams(&self) -> u64 {
        self.open_streams.load(Ordering::Relaxed)
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// `TOKENTAP_IT_FAST_PATH=0` (or `1`) turns `proxy.http1_fast_path` off (or on) for every
/// tokentap whose test YAML does not set it: `scripts/test.sh` runs the integration suite
/// once per path. A test that sets the key itself (to compare the paths) keeps its value.
pub fn fast_path_from_env(config: &mut Config, yaml: &str) {
    if yaml.contains("http1_fast_path") {
        return;
    }
    match std::env::var("TOKENTAP_IT_FAST_PATH").as_deref() {
        Ok("0") => config.proxy.http1_fast_path = false,
        Ok("1") => config.proxy.http1_fast_path = true,
        _ => {}
    }
}

/// A running tokentap.
pub struct Proxy {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    /// The live view's listener, while `ui.enabled`.
    pub ui: Option<SocketAddr>,
    stop: watch::Sender<bool>,
    pub task: Option<tokio::task::JoinHandle<Result<(), tokentap::ServeError>>>,
}

impl Proxy {
    /// tokentap in front of `upstream`, with extra YAML config (may be empty).
    pub async fn start(upstream: &str, yaml: &str) -> Proxy {
        access_log::install();
        let overrides = Overrides {
            upstream: Some(upstream.to_string()),
            listen: Some("127.0.0.1:0".into()),
            admin: Some("127.0.0.1:0".into()),
            ui_listen: Some("127.0.0.1:0".into()),
            ..Overrides::default()
        };
        let yaml = if yaml.trim().is_empty() { "{}" } else { yaml };
        let mut config = Config::from_yaml(yaml, "test", &overrides).expect("valid test config");
        fast_path_from_env(&mut config, yaml);
        // Two workers whatever the machine, so every test crosses the hand-off from the
        // accept loop to a worker and runs with more than one upstream pool shard.
        let server = Server::bind(config)
            .await
            .expect("bind tokentap")
            .with_workers(2);
        let addr = server.proxy_addr();
        let admin = server.admin_addr();
        let ui = server.ui_addr();
        let (stop, rx) = watch::channel(false);
        let task = tokio::spawn(server.run(stopped(rx)));
        Proxy {
            addr,
            admin,
            ui,
            stop,
            task: Some(task),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// The live view's address (panics when `ui.enabled` is off).
    pub fn live(&self) -> SocketAddr {
        self.ui.expect("the live view is on")
    }

    /// Ask for a graceful shutdown (like SIGTERM).
    pub fn shutdown(&self) {
        let _ = self.stop.send(true);
    }

    pub async fn metrics(&self) -> Metrics {
        scrape_metrics(self.admin).await
    }

    /// One raw scrape of `/metrics`, with `accept` as its `Accept` header if given:
    /// the served `Content-Type` and the body.
    pub async fn scrape_as(&self, accept: Option<&str>) -> (String, Bytes) {
        let mut request = Request::get(format!("http://{}/metrics", self.admin));
        if let Some(accept) = accept {
            request = request.header(hyper::header::ACCEPT, accept);
        }
        let response = client()
            .request(request.body(Full::new(Bytes::new())).expect("request"))
            .await
            .expect("scrape");
        let content_type = response
            .headers()
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        (content_type, body_bytes(response).await)
    }

    /// Poll `/metrics` until `condition` holds (panics after 10 s with the last scrape).
    pub async fn wait_metrics(&self, what: &str, condition: impl Fn(&Metrics) -> bool) -> Metrics {
        wait_for_metrics(self.admin, what, condition).await
    }

    pub async fn get(&self, path: &str) -> Response<Incoming> {
        client()
            .request(
                Request::get(self.url(path))
                    .body(Full::new(Bytes::new()))
                    .unwrap(),
            )
            .await
            .expect("request through proxy")
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// `yaml` as a valid configuration on free ports, its upstream a port nothing answers on:
/// for a test that binds a `Server` and reloads it without sending it traffic.
pub fn config_without_traffic(yaml: &str) -> Config {
    let overrides = Overrides {
        upstream: Some("http://127.0.0.1:9".into()),
        listen: Some("127.0.0.1:0".into()),
        admin: Some("127.0.0.1:0".into()),
        ui_listen: Some("127.0.0.1:0".into()),
        ..Overrides::default()
    };
    Config::from_yaml(yaml, "test", &overrides).expect("valid")
}

pub fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// One scrape of the `/metrics` of the admin port at `admin`.
pub async fn scrape_metrics(admin: SocketAddr) -> Metrics {
    let response = client()
        .request(
            Request::get(format!("http://{admin}/metrics"))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .expect("scrape");
    let text = body_text(response).await;
    Metrics::parse(&text)
}

/// Poll the `/metrics` at `admin` until `condition` holds (panics after 10 s with the
/// last scrape).
pub async fn wait_for_metrics(
    admin: SocketAddr,
    what: &str,
    condition: impl Fn(&Metrics) -> bool,
) -> Metrics {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let metrics = scrape_metrics(admin).await;
        if condition(&metrics) {
            return metrics;
        }
        if tokio::time::Instant::now() > deadline {
            panic!(
                "timed out waiting for {what}; last scrape:\n{}",
                metrics.text
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The whole body of `response`.
pub async fn body_bytes(response: Response<Incoming>) -> Bytes {
    response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes()
}

pub async fn body_text(response: Response<Incoming>) -> String {
    String::from_utf8_lossy(&body_bytes(response).await).into_owned()
}

/// A chat completion request.
pub fn chat(
    url: &str,
    model: &str,
    tenant: &str,
    stream: bool,
    usage: bool,
) -> Request<Full<Bytes>> {
    let mut body = serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "Say something."}],
        "stream": stream,
    });
    if usage {
        body["stream_options"] = serde_json::json!({"include_usage": true});
    }
    Request::post(url)
        .header("content-type", "application/json")
        .header("x-tenant-id", tenant)
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// One sample: metric name, labels, value.
type Sample = (String, Vec<(String, String)>, f64);

/// A parsed Prometheus text exposition.
pub struct Metrics {
    pub text: String,
    samples: Vec<Sample>,
}

impl Metrics {
    pub fn parse(text: &str) -> Metrics {
        let mut samples = Vec::new();
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').expect("sample line");
            let value: f64 = value.parse().expect("sample value");
            let (name, labels) = match series.split_once('{') {
                None => (series.to_string(), Vec::new()),
                Some((name, rest)) => {
                    let rest = rest.trim_end_matches('}');
                    let labels = rest
                        .split("\",")
                        .filter(|p| !p.is_empty())
                        .map(|pair| {
                            let (k, v) = pair.split_once('=').expect("label pair");
                            (k.to_string(), v.trim_matches('"').to_string())
                        })
                        .collect();
                    (name.to_string(), labels)
                }
            };
            samples.push((name, labels, value));
        }
        Metrics {
            text: text.to_string(),
            samples,
        }
    }

    /// Sum of every sample of `name` whose labels include all of `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|(n, l, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|(_, _, v)| *v)
            .sum()
    }

    /// Every sample of `name`: its labels and value.
    pub fn samples_of<'a>(
        &'a self,
        name: &'a str,
    ) -> impl Iterator<Item = (&'a [(String, String)], f64)> + 'a {
        self.samples
            .iter()
            .filter(move |(n, _, _)| n == name)
            .map(|(_, labels, value)| (labels.as_slice(), *value))
    }

    /// `sum / count` of a histogram for the given labels.
    pub fn mean(&self, histogram: &str, labels: &[(&str, &str)]) -> f64 {
        self.sum(&format!("{histogram}_sum"), labels)
            / self.sum(&format!("{histogram}_count"), labels)
    }
}

/// One step of a [`ScriptedBackend`] response.
#[derive(Clone, Debug)]
pub enum Step {
    /// Write these bytes as they are.
    Write(Vec<u8>),
    /// Wait this long.
    Sleep(Duration),
}

/// A raw TCP backend that answers every request with the same byte-exact script, so tests
/// control the response head to the byte (header case, no `Date`, chunked trailers).
pub struct ScriptedBackend {
    pub addr: SocketAddr,
    /// The request heads (and bodies) received, raw.
    pub requests: Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
}

impl ScriptedBackend {
    pub async fn start(script: Vec<Step>) -> ScriptedBackend {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = requests.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let script = script.clone();
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    if read_request(&mut stream, &mut buf).await.is_none() {
                        return;
                    }
                    seen.lock().unwrap().push(buf);
                    for step in script {
                        match step {
                            Step::Write(bytes) => {
                                if stream.write_all(&bytes).await.is_err() {
                                    return;
                                }
                            }
                            Step::Sleep(d) => tokio::time::sleep(d).await,
                        }
                    }
                    let _ = stream.shutdown().await;
                });
            }
        });
        ScriptedBackend { addr, requests }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

pub fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Read from a raw connection until `buf` holds one whole HTTP/1.1 request (its head and
/// a `Content-Length` body, if any) and return that request's length. `buf` may already
/// hold bytes, and keeps whatever came after the request. `None`: closed or failed first.
pub async fn read_request(stream: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    use tokio::io::AsyncReadExt;
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(i) = find(buf, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..i]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() >= i + 4 + length {
                return Some(i + 4 + length);
            }
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// `VmRSS` of a process (`"self"` or a pid), in bytes.
pub fn vm_rss_bytes(pid: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
}

/// Send a raw HTTP/1.1 request and read the raw response until the server closes.
pub async fn raw_exchange(addr: SocketAddr, request: &[u8]) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    // A server that refuses the request (431, say) may close before it was all written:
    // what it answered is still read below.
    let _ = stream.write_all(request).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out)).await;
    out
}

/// Split a raw HTTP/1.1 response into its header lines and its de-chunked body.
pub fn parse_raw_response(raw: &[u8]) -> (Vec<String>, Vec<u8>, Vec<String>) {
    let head_end = find(raw, b"\r\n\r\n").expect("response head") + 4;
    let head = String::from_utf8_lossy(&raw[..head_end]);
    let lines: Vec<String> = head
        .split("\r\n")
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    let chunked = lines
        .iter()
        .any(|l| l.eq_ignore_ascii_case("transfer-encoding: chunked"));
    let mut rest = &raw[head_end..];
    if !chunked {
        return (lines, rest.to_vec(), Vec::new());
    }
    let mut body = Vec::new();
    loop {
        let line_end = find(rest, b"\r\n").expect("chunk size line");
        let size_text = String::from_utf8_lossy(&rest[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16)
            .expect("chunk size");
        rest = &rest[line_end + 2..];
        if size == 0 {
            let trailers = String::from_utf8_lossy(rest)
                .split("\r\n")
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect();
            return (lines, body, trailers);
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}
