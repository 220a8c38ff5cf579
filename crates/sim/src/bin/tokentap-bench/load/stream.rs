//! One stream slot's work: build each request, read its stream event by event (the
//! per-event latency from the simulator's stamps, TTFT, mean ITL, tokens), and count what
//! failed; a slot runs request after request, or (hold mode) keeps one stream open.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use tokentap_sim::unix_ns;
use tokentap_wire::sse::{SseDecoder, SseEvent};

use super::conn::{connect_h1, H2Sender, Sender};
use super::Shared;

fn build_request(shared: &Shared, i: u64, http2: bool) -> (Request<Full<Bytes>>, Option<String>) {
    let args = &shared.args;
    let models = args.models.len().max(1) as u64;
    let model = args
        .models
        .get((i % models) as usize)
        .map_or("sim-model", String::as_str);
    let mut body = format!(
        r#"{{"model":"{model}","stream":true,"messages":[{{"role":"user","content":"Summarise today's news in one paragraph."}}]"#
    );
    if !args.no_usage {
        body.push_str(r#","stream_options":{"include_usage":true}"#);
    }
    if args.max_tokens > 0 {
        body.push_str(&format!(r#","max_tokens":{}"#, args.max_tokens));
    }
    body.push('}');
    let tenant = if args.unique_tenants {
        Some(format!("b{}-{i}", shared.run_id))
    } else if args.tenants > 0 {
        Some(format!("t{}", (i / models) % args.tenants))
    } else {
        None
    };
    let uri = if http2 {
        shared.uri.to_string().trim_end_matches('/').to_string() + &args.path
    } else {
        args.path.clone()
    };
    let mut builder = Request::post(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "text/event-stream");
    if !http2 {
        builder = builder.header(header::HOST, &shared.authority);
    }
    if let Some(t) = &tenant {
        builder = builder.header("x-tenant-id", t);
    }
    let request = builder
        .body(Full::new(Bytes::from(body)))
        .expect("static request parts are valid");
    (request, tenant)
}

/// What one stream saw.
#[derive(Default)]
struct StreamStats {
    first_token: Option<Instant>,
    /// The simulator's TTFT by its own stamps (first token sent - request received).
    sim_ttft_ns: Option<u64>,
    last_token: Option<Instant>,
    tokens: u64,
    usage_tokens: Option<u64>,
    stream_error: bool,
}

enum Failure {
    Status,
    Body,
    StreamError,
}

/// Send one request on `sender` and read its whole stream, recording every event.
async fn one_request(
    shared: &Shared,
    sender: &mut Sender,
    i: u64,
    on_event: &mut (dyn FnMut(u64) + Send),
) -> Result<(), Failure> {
    let http2 = matches!(sender, Sender::H2(_));
    let (request, tenant) = build_request(shared, i, http2);
    let t_send = Instant::now();
    let response = sender.send(request).await.map_err(|_| Failure::Body)?;
    if response.status() != StatusCode::OK {
        // Drain so the connection can be reused.
        let _ = response.into_body().collect().await;
        return Err(Failure::Status);
    }
    let mut body = response.into_body();
    let mut sse = SseDecoder::new(1 << 20);
    let mut st = StreamStats::default();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| Failure::Body)?;
        let arrived_wall = unix_ns();
        let arrived = Instant::now();
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let recording = shared.recording(arrived);
        if recording {
            shared.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        let mut fed = |ev: SseEvent<'_>| {
            count_event(shared, &mut st, ev, arrived, arrived_wall, recording);
            on_event(st.tokens);
        };
        if sse.feed(&data, &mut fed).is_err() {
            return Err(Failure::Body);
        }
    }
    if st.stream_error {
        return Err(Failure::StreamError);
    }
    let done = Instant::now();
    // Per-request figures count only requests wholly inside the window: one sent while
    // the connections were still being opened measures the ramp, not the steady load.
    if !shared.recording(t_send) || !shared.recording(done) {
        return Ok(());
    }
    shared.completed.fetch_add(1, Ordering::Relaxed);
    let ttft = st.first_token.map(|t| t.duration_since(t_send));
    let mean_itl = match (st.first_token, st.last_token) {
        (Some(a), Some(b)) if st.tokens >= 2 => Some(b.duration_since(a) / (st.tokens - 1) as u32),
        _ => None,
    };
    if let Some(t) = ttft {
        shared.ttft.record(t.as_nanos() as u64);
    }
    if let Some(t) = mean_itl {
        shared.itl.record(t.as_nanos() as u64);
    }
    if shared.args.requests_log.is_some() {
        let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1e3);
        let line = serde_json::json!({
            "tenant": tenant,
            "ttft_ms": ms(ttft),
            "mean_itl_ms": ms(mean_itl),
            "sim_ttft_ms": st.sim_ttft_ns.map(|ns| ns as f64 / 1e6),
            "tokens": st.tokens,
            "usage_tokens": st.usage_tokens,
        })
        .to_string();
        if let Ok(mut log) = shared.log.lock() {
            log.push(line);
        }
    }
    Ok(())
}

/// Record one event of a stream: its latency from the simulator's stamp, and whether it
/// is a token event (content), the first (TTFT), the usage report or an error.
fn count_event(
    shared: &Shared,
    st: &mut StreamStats,
    ev: SseEvent<'_>,
    arrived: Instant,
    arrived_wall: u64,
    recording: bool,
) {
    let d = ev.data;
    if d.starts_with(b"{\"error\"") || ev.event == "error" {
        st.stream_error = true;
        return;
    }
    let sent = shared
        .stamp
        .find(d)
        .map(|pos| parse_u64(&d[pos + shared.stamp.needle().len()..]));
    if let Some(sent) = sent {
        shared.events_all.fetch_add(1, Ordering::Relaxed);
        if recording {
            shared.events.fetch_add(1, Ordering::Relaxed);
            shared.latency.record(arrived_wall.saturating_sub(sent));
        }
    }
    if let Some(pos) = shared.content.find(d) {
        if d.get(pos + shared.content.needle().len()) != Some(&b'"') {
            st.tokens += 1;
            if st.first_token.is_none() {
                st.first_token = Some(arrived);
                let received = shared
                    .received
                    .find(d)
                    .map(|pos| parse_u64(&d[pos + shared.received.needle().len()..]));
                if let (Some(sent), Some(received)) = (sent, received) {
                    st.sim_ttft_ns = Some(sent.saturating_sub(received));
                }
            }
            st.last_token = Some(arrived);
            if recording {
                shared.token_events.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    if let Some(pos) = shared.completion.find(d) {
        st.usage_tokens = Some(parse_u64(&d[pos + shared.completion.needle().len()..]));
    }
}

fn parse_u64(bytes: &[u8]) -> u64 {
    let mut v: u64 = 0;
    for &b in bytes.iter().skip_while(|b| **b == b' ') {
        if !b.is_ascii_digit() {
            break;
        }
        v = v.wrapping_mul(10).wrapping_add(u64::from(b - b'0'));
    }
    v
}

fn count_failure(shared: &Shared, failure: &Failure) {
    let e = &shared.errors;
    match failure {
        Failure::Status => e.status.fetch_add(1, Ordering::Relaxed),
        Failure::Body => e.body.fetch_add(1, Ordering::Relaxed),
        Failure::StreamError => e.stream_error.fetch_add(1, Ordering::Relaxed),
    };
}

/// One stream slot: request after request on its own connection until the end.
pub(super) async fn stream_slot(shared: &Shared, h2: Option<H2Sender>) {
    let mut sender: Option<Sender> = h2.clone().map(Sender::H2);
    let mut backoff = Duration::from_millis(5);
    loop {
        let now = Instant::now();
        if now >= shared.end {
            return;
        }
        let i = shared.issued.fetch_add(1, Ordering::Relaxed);
        if shared.args.requests > 0 && i >= shared.args.requests {
            return;
        }
        let mut current = match sender.take() {
            Some(s) if !s.is_closed() => s,
            _ if h2.is_some() => {
                // A dead h2c connection is not replaced: its streams end here.
                shared.errors.connect.fetch_add(1, Ordering::Relaxed);
                return;
            }
            _ => match tokio::time::timeout_at(shared.end.into(), connect_h1(shared)).await {
                Err(_) => return,
                Ok(Ok(s)) => s,
                Ok(Err(_)) => {
                    if shared.recording(Instant::now()) {
                        shared.errors.connect.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                    continue;
                }
            },
        };
        backoff = Duration::from_millis(5);
        let deadline = (Instant::now() + shared.args.timeout).min(shared.end);
        let outcome = tokio::time::timeout_at(
            deadline.into(),
            one_request(shared, &mut current, i, &mut |_| {}),
        )
        .await;
        match outcome {
            Ok(Ok(())) => sender = Some(current),
            Ok(Err(failure)) => {
                if shared.recording(Instant::now()) {
                    count_failure(shared, &failure);
                }
                if h2.is_some() {
                    sender = Some(current);
                }
            }
            Err(_) => {
                if Instant::now() < shared.end {
                    shared.errors.timeout.fetch_add(1, Ordering::Relaxed);
                }
                // The connection is mid-body: drop it (h1) / the stream was reset (h2).
                if h2.is_some() {
                    sender = Some(current);
                }
            }
        }
    }
}

/// Hold mode: one stream, kept open until the end of the run.
pub(super) async fn hold_slot(shared: &Shared, h2: Option<Sender>) {
    let mut sender = match h2 {
        Some(s) => s,
        None => match connect_h1(shared).await {
            Ok(s) => s,
            Err(_) => {
                shared.errors.connect.fetch_add(1, Ordering::Relaxed);
                return;
            }
        },
    };
    let i = shared.issued.fetch_add(1, Ordering::Relaxed);
    let mut opened = false;
    let mut ready = false;
    let mut on_event = |token_events: u64| {
        if !opened {
            opened = true;
            shared.established.fetch_add(1, Ordering::Relaxed);
            let open = shared.open.fetch_add(1, Ordering::Relaxed) + 1;
            shared.open_max.fetch_max(open, Ordering::Relaxed);
        }
        if !ready && token_events >= shared.args.ready_after_events {
            ready = true;
            shared.ready.fetch_add(1, Ordering::Relaxed);
        }
    };
    let outcome = tokio::time::timeout_at(
        shared.end.into(),
        one_request(shared, &mut sender, i, &mut on_event),
    )
    .await;
    match outcome {
        Err(_) => {} // still open at the end: success
        Ok(Ok(())) => {
            shared.errors.early_end.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Err(failure)) => count_failure(shared, &failure),
    }
    if opened {
        shared.open.fetch_sub(1, Ordering::Relaxed);
    }
}
