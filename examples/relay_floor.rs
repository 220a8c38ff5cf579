//! A lower bound for tokentap's CPU per event: about the least a purpose-built HTTP/1.1
//! SSE relay on tokio can cost per event while observing what tokentap observes. What
//! tokentap spends above it is the price of its generality (hyper, any dialect and
//! encoding, metrics, limits); nginx, next to both, is a relay that observes nothing.
//!
//! It is a measuring stick, not a product path. It handles only what `tokentap-bench run`
//! sends through to `tokentap sim`: HTTP/1.1, request bodies with a Content-Length, and
//! responses that are chunked or have a Content-Length. Anything else ends the
//! connection, as does any error.
//!
//! The work per event is kept to tokentap's: one current-thread runtime per worker thread
//! (each with its own `SO_REUSEPORT` listener), a keep-alive upstream connection per client
//! connection, request and response bytes forwarded as they came (only the heads are
//! parsed, with httparse), and on the way through the chunked framing and SSE `data:`
//! lines are scanned, each OpenAI chunk is parsed with serde_json and the clock is read
//! once per event, with the gap between tokens counted in a histogram.
//!
//! Run it in the interleaved A/B (the first target also runs the simulator, so list
//! tokentap first):
//!
//! ```text
//! cargo build --release && cargo build --release --example relay_floor
//! bash scripts/bench/ab.sh tokentap=target/release/tokentap floor=target/release/examples/relay_floor
//! ```
//!
//! Alone: `relay_floor --config FILE`, where FILE is a tokentap config of which only
//! `listen` and `upstream.url` (`http://host:port`) are read. Workers:
//! `TOKIO_WORKER_THREADS` if it is a positive number, else one per CPU.

use std::borrow::Cow;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::BytesMut;
use clap::Parser;
use serde::Deserialize;
use serde_yaml::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::runtime::Runtime;

/// Header lines a request or response head may have.
const MAX_HEADERS: usize = 64;
/// Room for a response head plus whatever arrives with it; later reads fill it again.
const RESPONSE_BUFFER: usize = 16 * 1024;

#[derive(Parser)]
#[command(about = "The per-event CPU floor of a purpose-built SSE relay (see its source)")]
struct Args {
    /// tokentap config file: `listen` and `upstream.url` are read, the rest ignored.
    #[arg(long)]
    config: PathBuf,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("relay_floor: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let addresses =
        read_config(&args.config).with_context(|| format!("config {}", args.config.display()))?;
    let workers = (0..worker_count())
        .map(|_| Worker::bind(addresses.listen))
        .collect::<io::Result<Vec<_>>>()
        .with_context(|| format!("cannot listen on `listen: {}`", addresses.listen))?;
    let threads = workers
        .into_iter()
        .enumerate()
        .map(|(index, worker)| {
            std::thread::Builder::new()
                .name(format!("relay-floor-{index}"))
                .spawn(move || worker.serve(addresses.upstream))
        })
        .collect::<io::Result<Vec<_>>>()
        .context("cannot start the worker threads")?;
    for thread in threads {
        if thread.join().is_err() {
            anyhow::bail!("a worker thread panicked");
        }
    }
    Ok(())
}

struct Addresses {
    listen: SocketAddr,
    upstream: SocketAddr,
}

fn read_config(path: &Path) -> anyhow::Result<Addresses> {
    let text = std::fs::read_to_string(path).context("cannot read it")?;
    let yaml: Value = serde_yaml::from_str(&text).context("not YAML")?;
    let listen = yaml
        .get("listen")
        .and_then(Value::as_str)
        .context("`listen` is missing or not a string")?;
    let listen = listen
        .parse()
        .with_context(|| format!("`listen: {listen}` is not an IP:port address"))?;
    let url = yaml
        .get("upstream")
        .and_then(|upstream| upstream.get("url"))
        .and_then(Value::as_str)
        .context("`upstream.url` is missing or not a string")?;
    // Requests go upstream byte for byte, so there is no room for a base path.
    let authority = url
        .strip_prefix("http://")
        .map(|rest| rest.strip_suffix('/').unwrap_or(rest))
        .filter(|authority| !authority.contains('/'))
        .with_context(|| format!("`upstream.url: {url}` is not http://host:port"))?;
    let upstream = authority
        .to_socket_addrs()
        .ok()
        .and_then(|mut addresses| addresses.next())
        .with_context(|| format!("`upstream.url: {url}`: no address for {authority}"))?;
    Ok(Addresses { listen, upstream })
}

/// `TOKIO_WORKER_THREADS` if it is a positive number, else the CPUs this process may use.
fn worker_count() -> usize {
    std::env::var("TOKIO_WORKER_THREADS")
        .ok()
        .and_then(|value| value.trim().parse::<usize>().ok())
        .filter(|&count| count > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, Into::into))
}

/// One worker thread's runtime and listener, set up before the thread starts so that a
/// bad `listen` address is reported once, up front.
struct Worker {
    runtime: Runtime,
    listener: TcpListener,
}

impl Worker {
    fn bind(listen: SocketAddr) -> io::Result<Worker> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let socket = if listen.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        // Every worker binds the same address; the kernel spreads connections over them.
        socket.set_reuseport(true)?;
        socket.set_reuseaddr(true)?;
        socket.bind(listen)?;
        // The listener registers with the reactor of the runtime it is created in.
        let listener = {
            let _context = runtime.enter();
            socket.listen(4096)?
        };
        Ok(Worker { runtime, listener })
    }

    fn serve(self, upstream: SocketAddr) {
        let Worker { runtime, listener } = self;
        runtime.block_on(async move {
            loop {
                match listener.accept().await {
                    Ok((client, _)) => {
                        tokio::spawn(async move {
                            let _ = relay_connection(client, upstream).await;
                        });
                    }
                    // Usually out of file descriptors: back off instead of spinning.
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        })
    }
}

/// Relay one client connection's requests, in turn, over one upstream connection.
async fn relay_connection(mut client: TcpStream, upstream_address: SocketAddr) -> io::Result<()> {
    client.set_nodelay(true)?;
    let mut request_buffer = BytesMut::with_capacity(8192);
    let mut response_buffer = vec![0; RESPONSE_BUFFER];
    // Opened for the first request, kept for the rest.
    let mut upstream: Option<TcpStream> = None;
    while let Some(request) = read_request(&mut client, &mut request_buffer).await? {
        let upstream = match &mut upstream {
            Some(upstream) => upstream,
            None => upstream.insert(connect(upstream_address).await?),
        };
        upstream.write_all(&request).await?;
        relay_response(upstream, &mut client, &mut response_buffer).await?;
    }
    Ok(())
}

async fn connect(address: SocketAddr) -> io::Result<TcpStream> {
    let stream = TcpStream::connect(address).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// The next whole request (head and body) from the client, or `None` once it has closed.
async fn read_request(
    client: &mut TcpStream,
    buffer: &mut BytesMut,
) -> io::Result<Option<BytesMut>> {
    let (head_len, body_len) = loop {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut head = httparse::Request::new(&mut headers);
        if let httparse::Status::Complete(head_len) = head.parse(buffer).map_err(invalid_data)? {
            if header(head.headers, "transfer-encoding").is_some() {
                return Err(invalid_data("a request body without Content-Length"));
            }
            break (head_len, content_length(head.headers)?.unwrap_or(0));
        }
        if client.read_buf(buffer).await? == 0 {
            return Ok(None);
        }
    };
    while buffer.len() < head_len + body_len {
        if client.read_buf(buffer).await? == 0 {
            return Ok(None);
        }
    }
    let request = buffer.split_to(head_len + body_len);
    // tokentap reads `model` from every request body, for its labels.
    let model = serde_json::from_slice::<RequestBody>(&request[head_len..])
        .ok()
        .and_then(|body| body.model.map(str::len));
    std::hint::black_box(model);
    Ok(Some(request))
}

/// Relay one response from upstream to the client, observing its events on the way.
async fn relay_response(
    upstream: &mut TcpStream,
    client: &mut TcpStream,
    buffer: &mut [u8],
) -> io::Result<()> {
    let mut filled = 0;
    let (head_len, mut body) = loop {
        if filled == buffer.len() {
            return Err(invalid_data("a response head larger than the buffer"));
        }
        let read = upstream.read(&mut buffer[filled..]).await?;
        if read == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        filled += read;
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut head = httparse::Response::new(&mut headers);
        if let httparse::Status::Complete(head_len) =
            head.parse(&buffer[..filled]).map_err(invalid_data)?
        {
            let status = head.code.unwrap_or_default();
            break (head_len, ResponseBody::new(status, head.headers)?);
        }
    };
    let mut observer = EventObserver::new();
    let mut body_start = head_len;
    loop {
        body.scan(&buffer[body_start..filled], &mut observer)?;
        // The bytes go out as they came, the head with the first of them.
        client.write_all(&buffer[..filled]).await?;
        if body.is_done() {
            break;
        }
        filled = upstream.read(buffer).await?;
        if filled == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        body_start = 0;
    }
    std::hint::black_box((observer.tokens, &observer.gap_histogram));
    Ok(())
}

fn header<'a>(headers: &[httparse::Header<'a>], name: &str) -> Option<&'a [u8]> {
    headers
        .iter()
        .find(|header| header.name.eq_ignore_ascii_case(name))
        .map(|header| header.value)
}

fn content_length(headers: &[httparse::Header]) -> io::Result<Option<usize>> {
    let Some(value) = header(headers, "content-length") else {
        return Ok(None);
    };
    std::str::from_utf8(value)
        .ok()
        .and_then(|value| value.trim().parse().ok())
        .map(Some)
        .ok_or_else(|| invalid_data("a bad Content-Length"))
}

fn invalid_data(err: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, err)
}

/// How a response body ends, and how far it has come.
enum ResponseBody {
    Chunked(Chunked),
    /// Bytes still to come.
    Length(usize),
}

impl ResponseBody {
    fn new(status: u16, headers: &[httparse::Header]) -> io::Result<ResponseBody> {
        if header(headers, "transfer-encoding").is_some_and(|value| value.ends_with(b"chunked")) {
            return Ok(ResponseBody::Chunked(Chunked::Size(0)));
        }
        match content_length(headers)? {
            Some(length) => Ok(ResponseBody::Length(length)),
            None if matches!(status, 204 | 304) => Ok(ResponseBody::Length(0)),
            None => Err(invalid_data(
                "a response body that ends when the connection does",
            )),
        }
    }

    /// Look at the next bytes of the body: the observer gets the data, not the framing.
    fn scan(&mut self, bytes: &[u8], observer: &mut EventObserver) -> io::Result<()> {
        match self {
            ResponseBody::Chunked(state) => state.scan(bytes, observer),
            ResponseBody::Length(remaining) => {
                let bytes = &bytes[..bytes.len().min(*remaining)];
                observer.feed(bytes);
                *remaining -= bytes.len();
                Ok(())
            }
        }
    }

    fn is_done(&self) -> bool {
        matches!(
            self,
            ResponseBody::Chunked(Chunked::Done) | ResponseBody::Length(0)
        )
    }
}

/// Where a scan of chunked framing (RFC 9112 §7.1) stands. CRs and LFs are skipped, not
/// checked: this only needs to find the data and the end.
enum Chunked {
    /// In a chunk-size line: the size so far.
    Size(u64),
    /// In a chunk extension, after the size.
    Extension(u64),
    /// At the LF that ends a chunk-size line.
    SizeLf(u64),
    /// In chunk data: the bytes still to come.
    Data(u64),
    /// At the CR, then the LF, after chunk data.
    DataCr,
    DataLf,
    /// After the last chunk, at the start of a line: a CR here is the body's end.
    TrailerLine,
    /// In a trailer field line.
    TrailerField,
    /// At the body's last LF.
    EndLf,
    Done,
}

impl Chunked {
    fn scan(&mut self, mut bytes: &[u8], observer: &mut EventObserver) -> io::Result<()> {
        while let Some(&byte) = bytes.first() {
            if let Chunked::Data(left) = *self {
                let take = bytes.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                observer.feed(&bytes[..take]);
                bytes = &bytes[take..];
                *self = match left - take as u64 {
                    0 => Chunked::DataCr,
                    left => Chunked::Data(left),
                };
                continue;
            }
            bytes = &bytes[1..];
            *self = match (&*self, byte) {
                (Chunked::Size(size), b'\r') | (Chunked::Extension(size), b'\r') => {
                    Chunked::SizeLf(*size)
                }
                (Chunked::Size(size), _) => match (byte as char).to_digit(16) {
                    Some(digit) => size
                        .checked_mul(16)
                        .map(|size| Chunked::Size(size + u64::from(digit)))
                        .ok_or_else(|| invalid_data("a chunk size too large"))?,
                    None => Chunked::Extension(*size),
                },
                (Chunked::Extension(size), _) => Chunked::Extension(*size),
                (Chunked::SizeLf(0), _) => Chunked::TrailerLine,
                (Chunked::SizeLf(size), _) => Chunked::Data(*size),
                (Chunked::DataCr, _) => Chunked::DataLf,
                (Chunked::DataLf, _) => Chunked::Size(0),
                (Chunked::TrailerLine, b'\r') => Chunked::EndLf,
                (Chunked::TrailerLine, _) => Chunked::TrailerField,
                (Chunked::TrailerField, b'\n') => Chunked::TrailerLine,
                (Chunked::TrailerField, _) => Chunked::TrailerField,
                (Chunked::EndLf, _) | (Chunked::Done, _) => Chunked::Done,
                (Chunked::Data(_), _) => unreachable!("chunk data is taken whole above"),
            };
        }
        Ok(())
    }
}

/// The request body field tokentap reads.
#[derive(Deserialize)]
struct RequestBody<'a> {
    #[serde(borrow, default)]
    model: Option<&'a str>,
}

/// The fields of an OpenAI chat completion chunk that make a token.
#[derive(Deserialize)]
struct CompletionChunk<'a> {
    #[serde(borrow, default)]
    choices: Vec<Choice<'a>>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(borrow, default)]
    delta: Option<Delta<'a>>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
}

/// tokentap's observation of one response, reduced to its cost: SSE lines, a JSON parse
/// per `data:` line, a clock read per event and a histogram of the gaps between tokens.
struct EventObserver {
    /// The start of a line whose end has not arrived yet.
    partial_line: Vec<u8>,
    tokens: u64,
    last_token: Option<Instant>,
    /// Gaps between tokens, by the bit length of their microseconds.
    gap_histogram: [u64; 64],
}

impl EventObserver {
    fn new() -> EventObserver {
        EventObserver {
            partial_line: Vec::new(),
            tokens: 0,
            last_token: None,
            gap_histogram: [0; 64],
        }
    }

    fn feed(&mut self, data: &[u8]) {
        let mut rest = data;
        while let Some(end) = memchr::memchr(b'\n', rest) {
            if self.partial_line.is_empty() {
                self.line(&rest[..end]);
            } else {
                self.partial_line.extend_from_slice(&rest[..end]);
                let mut line = std::mem::take(&mut self.partial_line);
                self.line(&line);
                // Keep the allocation for the next split line.
                line.clear();
                self.partial_line = line;
            }
            rest = &rest[end + 1..];
        }
        self.partial_line.extend_from_slice(rest);
    }

    fn line(&mut self, line: &[u8]) {
        let Some(payload) = line.strip_prefix(b"data:") else {
            return;
        };
        let payload = payload.strip_prefix(b" ").unwrap_or(payload);
        if payload == b"[DONE]" {
            return;
        }
        let Ok(chunk) = serde_json::from_slice::<CompletionChunk>(payload) else {
            return;
        };
        let now = Instant::now();
        for choice in &chunk.choices {
            let content = choice
                .delta
                .as_ref()
                .and_then(|delta| delta.content.as_ref());
            if content.is_some_and(|content| !content.is_empty()) {
                self.tokens += 1;
                if let Some(last) = self.last_token {
                    let micros = now.duration_since(last).as_micros() as u64;
                    self.gap_histogram[(64 - micros.leading_zeros() as usize).min(63)] += 1;
                }
                self.last_token = Some(now);
            }
        }
    }
}
