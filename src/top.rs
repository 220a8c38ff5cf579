//! `tokentap top`: the live view's figures in a terminal, against any running tokentap's
//! admin address.
//!
//! One reader thread subscribes to `/api/live/stream` (the same server-sent `tick` frames
//! the page reads, serialized once on the server for every viewer) and hands each frame
//! to the terminal loop, which redraws a table per model and the slowest requests in flight
//! (ratatui on crossterm). `w` cycles the window (10 s, 1 min, 5 min: a new subscription).
//! `q`, Esc or Ctrl-C quits; when the server goes away (the stream
//! ends or breaks) the terminal is restored and [`run`] says so.

use std::io;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table};
use ratatui::{DefaultTerminal, Frame};
use serde_json::Value;

/// What `top` watches.
#[derive(Clone, Debug)]
pub struct TopOptions {
    /// The admin address, `host:port`.
    pub admin: String,
    /// The window in seconds (10, 60 or 300).
    pub window: u64,
}

/// How `top` ended.
#[derive(Debug, PartialEq, Eq)]
pub enum TopEnd {
    /// The user quit.
    Quit,
    /// The server went away (the stream ended or broke), with why.
    ServerGone(String),
}

#[derive(Debug, thiserror::Error)]
pub enum TopError {
    #[error("cannot reach the live view at {0}: {1}")]
    Connect(String, String),
    #[error("terminal: {0}")]
    Terminal(#[from] io::Error),
}

enum Message {
    Frame(Value),
    Gone(String),
}

/// Run until `q` or the server goes away. Connects first, so an address with no live view
/// fails before the terminal is touched.
pub fn run(options: &TopOptions) -> Result<TopEnd, TopError> {
    let (rx, ready) = spawn_reader(&options.admin, options.window)?;
    match ready.recv() {
        Ok(Ok(())) => {}
        Ok(Err(why)) => return Err(TopError::Connect(options.admin.clone(), why)),
        Err(_) => {
            return Err(TopError::Connect(
                options.admin.clone(),
                "the reader stopped".into(),
            ))
        }
    }
    let mut terminal = ratatui::init();
    let end = ui(&mut terminal, options.clone(), rx);
    ratatui::restore();
    Ok(end?)
}

/// A reader thread on `window`'s stream: its frames, and whether it connected.
#[allow(clippy::type_complexity)]
fn spawn_reader(
    admin: &str,
    window: u64,
) -> io::Result<(mpsc::Receiver<Message>, mpsc::Receiver<Result<(), String>>)> {
    let (tx, rx) = mpsc::channel();
    let (ready_tx, ready_rx) = mpsc::channel();
    let url = format!("http://{admin}/api/live/stream?window={window}");
    std::thread::Builder::new()
        .name("top-reader".into())
        .spawn(move || read_stream(&url, &ready_tx, &tx))?;
    Ok((rx, ready_rx))
}

/// The next window of [`WINDOWS`] after `window`.
fn next_window(window: u64) -> u64 {
    let i = WINDOWS.iter().position(|&w| w == window).unwrap_or(0);
    WINDOWS[(i + 1) % WINDOWS.len()]
}

/// The windows `top` cycles through with `w`, as the server offers them.
const WINDOWS: [u64; 3] = [10, 60, 300];

/// The reader: the SSE stream's `tick` frames to `tx`, and why it ended.
fn read_stream(url: &str, ready: &mpsc::Sender<Result<(), String>>, tx: &mpsc::Sender<Message>) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            let _ = ready.send(Err(e.to_string()));
            return;
        }
    };
    runtime.block_on(async {
        let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
        let request = match Request::get(url).body(Empty::new()) {
            Ok(request) => request,
            Err(e) => {
                let _ = ready.send(Err(e.to_string()));
                return;
            }
        };
        let response =
            match tokio::time::timeout(Duration::from_secs(5), client.request(request)).await {
                Ok(Ok(response)) => response,
                Ok(Err(e)) => {
                    let _ = ready.send(Err(e.to_string()));
                    return;
                }
                Err(_) => {
                    let _ = ready.send(Err("no answer in 5 s".into()));
                    return;
                }
            };
        if !response.status().is_success() {
            let _ = ready.send(Err(format!("{} (is ui.enabled off?)", response.status())));
            return;
        }
        let _ = ready.send(Ok(()));
        let mut body = response.into_body();
        let mut pending = String::new();
        loop {
            // A tick comes every second: three missed means the server is gone.
            let frame = match tokio::time::timeout(Duration::from_secs(3), body.frame()).await {
                Err(_) => {
                    let _ = tx.send(Message::Gone("no frame for 3 s".into()));
                    return;
                }
                Ok(None) => {
                    let _ = tx.send(Message::Gone("the stream ended".into()));
                    return;
                }
                Ok(Some(Err(e))) => {
                    let _ = tx.send(Message::Gone(e.to_string()));
                    return;
                }
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            pending.push_str(&String::from_utf8_lossy(&data));
            while let Some(end) = pending.find("\n\n") {
                let event: String = pending.drain(..end + 2).collect();
                if let Some(json) = tick_data(&event) {
                    if let Ok(value) = serde_json::from_str(json) {
                        if tx.send(Message::Frame(value)).is_err() {
                            return;
                        }
                    }
                }
            }
        }
    });
}

/// The data of a `tick` event.
fn tick_data(event: &str) -> Option<&str> {
    let mut lines = event.lines();
    if lines.next()? != "event: tick" {
        return None;
    }
    lines.find_map(|line| line.strip_prefix("data: "))
}

fn ui(
    terminal: &mut DefaultTerminal,
    mut options: TopOptions,
    mut rx: mpsc::Receiver<Message>,
) -> io::Result<TopEnd> {
    let mut latest: Option<Value> = None;
    let mut frames = 0u64;
    let mut drawn = Instant::now() - Duration::from_secs(1);
    let mut dirty = true;
    loop {
        loop {
            match rx.try_recv() {
                Ok(Message::Frame(value)) => {
                    latest = Some(value);
                    frames += 1;
                    dirty = true;
                }
                Ok(Message::Gone(why)) => return Ok(TopEnd::ServerGone(why)),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    return Ok(TopEnd::ServerGone("the reader stopped".into()))
                }
            }
        }
        if dirty || drawn.elapsed() >= Duration::from_secs(1) {
            terminal.draw(|f| draw(f, &options, latest.as_ref(), frames))?;
            drawn = Instant::now();
            dirty = false;
        }
        if event::poll(Duration::from_millis(100))? {
            match event::read()? {
                Event::Key(key) if key.kind == KeyEventKind::Press => {
                    let ctrl_c = key.code == KeyCode::Char('c')
                        && key.modifiers.contains(KeyModifiers::CONTROL);
                    if ctrl_c || matches!(key.code, KeyCode::Char('q') | KeyCode::Esc) {
                        return Ok(TopEnd::Quit);
                    }
                    if key.code == KeyCode::Char('w') {
                        // The next window: a new subscription; the old reader ends at its
                        // next frame, when it finds nobody listening.
                        options.window = next_window(options.window);
                        let (next, ready) = spawn_reader(&options.admin, options.window)?;
                        match ready.recv() {
                            Ok(Ok(())) => {}
                            Ok(Err(why)) => return Ok(TopEnd::ServerGone(why)),
                            Err(_) => return Ok(TopEnd::ServerGone("the reader stopped".into())),
                        }
                        rx = next;
                        latest = None;
                        frames = 0;
                        dirty = true;
                    }
                }
                Event::Resize(..) => dirty = true,
                _ => {}
            }
        }
    }
}

fn secs(value: &Value) -> String {
    match value.as_f64() {
        None => "–".into(),
        Some(v) if v < 1.0 => format!("{:.1} ms", v * 1e3),
        Some(v) => format!("{v:.2} s"),
    }
}

fn number(value: &Value, digits: usize) -> String {
    value
        .as_f64()
        .map_or_else(|| "–".into(), |v| format!("{v:.digits$}"))
}

/// What a request in flight waits for, short, from the live API's `phase`.
fn phase(value: &Value) -> String {
    match value.as_str() {
        Some("waiting_head") => "await head".into(),
        Some("waiting_first_token") => "await token".into(),
        Some(other) => other.into(),
        None => "".into(),
    }
}

fn text(value: &Value) -> String {
    value.as_str().unwrap_or("").to_string()
}

fn draw(f: &mut Frame, options: &TopOptions, frame: Option<&Value>, frames: u64) {
    let mut listed: Vec<&Value> = frame
        .and_then(|v| v["models"].as_array())
        .into_iter()
        .flatten()
        .collect();
    listed.sort_by_key(|m| m["model"].as_str().unwrap_or_default().to_string());
    let [head, models, streams, foot] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(listed.len().max(1) as u16 + 3),
        Constraint::Min(5),
        Constraint::Length(1),
    ])
    .areas(f.area());
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let at = frame
        .and_then(|v| v["at_ms"].as_u64())
        .map(|ms| {
            let secs = ms / 1000;
            format!(
                "{:02}:{:02}:{:02} UTC",
                secs / 3600 % 24,
                secs / 60 % 60,
                secs % 60
            )
        })
        .unwrap_or_else(|| "waiting for data".into());
    f.render_widget(
        Paragraph::new(Line::from(format!(
            "tokentap top  {}  window {} s  {}  frames {}",
            options.admin, options.window, at, frames
        )))
        .style(bold),
        head,
    );

    let header = Row::new(
        [
            "model",
            "req/s",
            "TTFT p50",
            "p90",
            "p99",
            "ITL p50",
            "p90",
            "p99",
            "tok/s",
            "in flight",
            "completed",
        ]
        .map(Cell::from),
    )
    .style(bold);
    let rows: Vec<Row> = listed
        .iter()
        .map(|m| {
            let requests = m["requests"].as_f64().unwrap_or(0.0);
            let completed = m["outcomes"]["completed"].as_f64().unwrap_or(0.0);
            Row::new(vec![
                Cell::from(text(&m["model"])),
                Cell::from(number(&m["requests_per_s"], 2)),
                Cell::from(secs(&m["ttft"]["p50"])),
                Cell::from(secs(&m["ttft"]["p90"])),
                Cell::from(secs(&m["ttft"]["p99"])),
                Cell::from(secs(&m["itl"]["p50"])),
                Cell::from(secs(&m["itl"]["p90"])),
                Cell::from(secs(&m["itl"]["p99"])),
                Cell::from(number(&m["tokens_per_s"], 1)),
                Cell::from(m["in_flight"].to_string()),
                Cell::from(if requests > 0.0 {
                    format!("{:.1}%", 100.0 * completed / requests)
                } else {
                    "–".into()
                }),
            ])
        })
        .collect();
    let widths = [
        Constraint::Length(24),
        Constraint::Length(7),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(8),
        Constraint::Length(9),
        Constraint::Length(9),
    ];
    f.render_widget(
        Table::new(rows, widths).header(header).block(
            Block::default()
                .borders(Borders::ALL)
                .title(" per model, over the window "),
        ),
        models,
    );

    // The slowest requests in flight: longest since their last token (or, with none yet,
    // since their request), then largest gap.
    let mut shown: Vec<&Value> = frame
        .and_then(|v| v["in_flight"]["streams"].as_array())
        .into_iter()
        .flatten()
        .collect();
    let key = |s: &Value| {
        (
            s["since_last_event_s"]
                .as_f64()
                .unwrap_or(s["elapsed_s"].as_f64().unwrap_or(0.0)),
            s["largest_gap_s"].as_f64().unwrap_or(0.0),
        )
    };
    shown.sort_by(|a, b| {
        key(b)
            .partial_cmp(&key(a))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    let total = frame
        .and_then(|v| v["in_flight"]["total"].as_u64())
        .unwrap_or(0);
    let header = Row::new(
        [
            "model",
            "tenant",
            "phase",
            "elapsed",
            "tokens",
            "tok/s",
            "largest gap",
            "since last token",
        ]
        .map(Cell::from),
    )
    .style(bold);
    let rows: Vec<Row> = shown
        .iter()
        .map(|s| {
            Row::new(vec![
                Cell::from(s["model"].as_str().unwrap_or("–").to_string()),
                Cell::from(text(&s["tenant"])),
                Cell::from(phase(&s["phase"])),
                Cell::from(secs(&s["elapsed_s"])),
                Cell::from(s["tokens"].to_string()),
                Cell::from(number(&s["tokens_per_s"], 1)),
                Cell::from(secs(&s["largest_gap_s"])),
                Cell::from(secs(&s["since_last_event_s"])),
            ])
        })
        .collect();
    let widths = [
        Constraint::Length(24),
        Constraint::Length(16),
        Constraint::Length(11),
        Constraint::Length(10),
        Constraint::Length(7),
        Constraint::Length(7),
        Constraint::Length(12),
        Constraint::Length(17),
    ];
    f.render_widget(
        Table::new(rows, widths).header(header).block(
            Block::default()
                .borders(Borders::ALL)
                .title(format!(" slowest requests in flight ({total} now) ")),
        ),
        streams,
    );
    f.render_widget(
        Paragraph::new("q quit  w window (10 s, 1 min, 5 min)"),
        foot,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn w_cycles_the_windows() {
        assert_eq!(next_window(60), 300);
        assert_eq!(next_window(300), 10);
        assert_eq!(next_window(10), 60);
    }

    #[test]
    fn only_tick_events_are_read() {
        assert_eq!(
            tick_data("event: tick\ndata: {\"a\":1}\n\n"),
            Some("{\"a\":1}")
        );
        assert_eq!(tick_data("event: requests\ndata: {}\n\n"), None);
        assert_eq!(tick_data("retry: 2000\n: tokentap live\n\n"), None);
    }
}
