//! `tokentap top`: the live view's figures in a terminal, against any running tokentap's
//! live-view address (`ui.listen`).
//!
//! One reader thread subscribes to `/api/live/stream` (the same server-sent `tick` frames
//! the page reads, serialized once on the server for every viewer) and hands each frame
//! to the terminal loop, which redraws a table per model and the slowest requests in flight
//! (ratatui on crossterm). `w` cycles the window (10 s, 1 min, 5 min: a new subscription).
//! `q`, Esc or Ctrl-C quits; when the server goes away (the stream
//! ends or breaks) the terminal is restored and [`run`] says so.
//!
//! Whatever answers at the address is not trusted, and what it sends reaches a terminal:
//! events are cut by the project's SSE decoder ([`SseDecoder`]), which refuses one larger
//! than [`MAX_EVENT_BYTES`] instead of buffering it; a `tick` is read into the live view's
//! own frame type ([`live::Frame`]), whose reading keeps at most [`live::MAX_MODEL_ROWS`] and
//! [`live::MAX_STREAM_ROWS`] rows, skips the rest and what top does not draw unread, and passes
//! every string through [`live::shown`] (no control character, so no escape sequence
//! reaches the terminal); and a stream that completes no readable `tick` for [`NO_TICK`]
//! is taken for gone, whatever else it sends.

use std::io;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::live::frame::{self as live, Attainment, ModelFigures, StreamFigures};
use crate::wire::sse::{SseDecoder, SseEvent};
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

/// A `tick` frame as top reads it: the live view's own [`live::Frame`], read under its
/// bounds.
type Tick = live::Frame;

/// The largest SSE event `top` reads; a larger one ends `top` with a message. A live
/// view frame lists at most 34 models ([`live::MAX_MODEL_ROWS`]), 20 requests in flight and 20
/// slowest ones, and a `requests` event at most 100 finished
/// requests: with label values of the default 128 bytes, every byte escaped in the JSON
/// (`\u001b`), and the default buckets, either stays under 250 KiB. 1 MiB leaves room for
/// longer label values and more buckets.
pub const MAX_EVENT_BYTES: usize = 1 << 20;
/// A tick comes every second: this long without a readable one and the server is taken
/// for gone.
pub const NO_TICK: Duration = Duration::from_secs(3);
/// Frames read but not yet drawn; the reader drops a frame when the terminal is this far
/// behind (the next one replaces it within a second).
const QUEUED_FRAMES: usize = 4;

/// What `top` watches.
#[derive(Clone, Debug)]
pub struct TopOptions {
    /// The live view's address (`ui.listen`), `host:port`.
    pub addr: String,
    /// The window in seconds (10, 60 or 300).
    pub window: u64,
}

/// How `top` ended.
#[derive(Debug, PartialEq, Eq)]
pub enum TopEnd {
    /// The user quit.
    Quit,
    /// The server went away (the stream ended or broke, or sent what `top` refuses), with
    /// why.
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
    Frame(Tick),
    Gone(String),
}

/// The model's least-met objective over the window, and how many more were judged:
/// the one a contract is at risk on.
fn objectives_cell(m: &ModelFigures) -> String {
    let judged: Vec<(&Attainment, f64)> = m
        .objectives
        .kept
        .iter()
        // From the counts read, not the server's ratio.
        .filter_map(|o| Attainment::share(o.met, o.missed).map(|a| (o, a)))
        .collect();
    let Some((worst, share)) = judged.iter().min_by(|a, b| a.1.total_cmp(&b.1)) else {
        return "–".into();
    };
    let more = judged.len() - 1;
    let more = if more > 0 {
        format!(" +{more}")
    } else {
        String::new()
    };
    format!("{} {:.1}%{more}", worst.objective, 100.0 * share)
}

/// The stream's bytes to frames: SSE events cut by the bounded decoder, `tick` events read
/// into [`Tick`]s.
struct TickReader {
    decoder: SseDecoder,
}

impl TickReader {
    fn new() -> TickReader {
        TickReader {
            decoder: SseDecoder::new(MAX_EVENT_BYTES),
        }
    }

    /// The latest readable `tick` these bytes complete, if any (only the latest is drawn);
    /// `Err` with why when the stream must not be read further.
    fn feed(&mut self, bytes: &[u8]) -> Result<Option<Tick>, String> {
        let mut latest = None;
        self.decoder
            .feed(bytes, &mut |event: SseEvent<'_>| {
                if event.event == "tick" {
                    if let Ok(tick) = serde_json::from_slice::<Tick>(event.data) {
                        latest = Some(tick);
                    }
                }
            })
            .map_err(|_| {
                format!(
                    "it sent an event larger than {} KiB, the most top reads: refused",
                    MAX_EVENT_BYTES / 1024
                )
            })?;
        Ok(latest)
    }
}

/// Run until `q` or the server goes away. Connects first, so an address with no live view
/// fails before the terminal is touched.
pub fn run(options: &TopOptions) -> Result<TopEnd, TopError> {
    let (rx, ready) = spawn_reader(&options.addr, options.window)?;
    match ready.recv() {
        Ok(Ok(())) => {}
        Ok(Err(why)) => return Err(TopError::Connect(options.addr.clone(), why)),
        Err(_) => {
            return Err(TopError::Connect(
                options.addr.clone(),
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
    addr: &str,
    window: u64,
) -> io::Result<(mpsc::Receiver<Message>, mpsc::Receiver<Result<(), String>>)> {
    let (tx, rx) = mpsc::sync_channel(QUEUED_FRAMES);
    let (ready_tx, ready_rx) = mpsc::channel();
    let url = format!("http://{addr}/api/live/stream?window={window}");
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
fn read_stream(
    url: &str,
    ready: &mpsc::Sender<Result<(), String>>,
    tx: &mpsc::SyncSender<Message>,
) {
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
        let mut reader = TickReader::new();
        let mut deadline = tokio::time::Instant::now() + NO_TICK;
        let why = loop {
            let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
                Err(_) => break format!("no readable tick for {} s", NO_TICK.as_secs()),
                Ok(None) => break "the stream ended".into(),
                Ok(Some(Err(e))) => break e.to_string(),
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            match reader.feed(&data) {
                Err(why) => break why,
                Ok(None) => {}
                Ok(Some(tick)) => {
                    deadline = tokio::time::Instant::now() + NO_TICK;
                    match tx.try_send(Message::Frame(tick)) {
                        Ok(()) | Err(mpsc::TrySendError::Full(_)) => {}
                        // Nobody listens (`w` subscribed anew, or top ended).
                        Err(mpsc::TrySendError::Disconnected(_)) => return,
                    }
                }
            }
        };
        let _ = tx.send(Message::Gone(why));
    });
}

fn ui(
    terminal: &mut DefaultTerminal,
    mut options: TopOptions,
    mut rx: mpsc::Receiver<Message>,
) -> io::Result<TopEnd> {
    let mut latest: Option<Tick> = None;
    let mut frames = 0u64;
    let mut drawn = Instant::now() - Duration::from_secs(1);
    let mut dirty = true;
    loop {
        loop {
            match rx.try_recv() {
                Ok(Message::Frame(tick)) => {
                    latest = Some(tick);
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
                        let (next, ready) = spawn_reader(&options.addr, options.window)?;
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

fn secs(value: Option<f64>) -> String {
    match value {
        None => "–".into(),
        Some(v) if v < 1.0 => format!("{:.1} ms", v * 1e3),
        Some(v) => format!("{v:.2} s"),
    }
}

fn number(value: Option<f64>, digits: usize) -> String {
    value.map_or_else(|| "–".into(), |v| format!("{v:.digits$}"))
}

/// What a request in flight waits for, short, from the live API's `phase`.
fn phase(value: &str) -> &str {
    match value {
        "waiting_head" => "await head",
        "waiting_first_token" => "await token",
        other => other,
    }
}

/// A table's title, with the rows the frame had past what `top` keeps.
fn titled(title: String, skipped: u64) -> String {
    if skipped == 0 {
        format!(" {title} ")
    } else {
        format!(" {title} ({skipped} more not shown) ")
    }
}

fn draw(f: &mut Frame, options: &TopOptions, frame: Option<&Tick>, frames: u64) {
    let mut listed: Vec<&ModelFigures> = frame
        .map(|t| t.models.kept.iter().collect())
        .unwrap_or_default();
    listed.sort_by(|a, b| a.model.cmp(&b.model));
    let rows_height = u16::try_from(listed.len().max(1)).unwrap_or(u16::MAX);
    let [head, models, streams, foot] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(rows_height.saturating_add(3)),
        Constraint::Min(5),
        Constraint::Length(1),
    ])
    .areas(f.area());
    f.render_widget(heading(options, frame, frames), head);
    f.render_widget(models_table(&listed, frame), models);
    f.render_widget(streams_table(frame), streams);
    f.render_widget(
        Paragraph::new("q quit  w window (10 s, 1 min, 5 min)"),
        foot,
    );
}

fn bold() -> Style {
    Style::default().add_modifier(Modifier::BOLD)
}

/// The top line: the address, the window, the frame's time and how many frames came.
fn heading(options: &TopOptions, frame: Option<&Tick>, frames: u64) -> Paragraph<'static> {
    let at = frame
        .map(|t| t.at_ms)
        .filter(|&ms| ms > 0)
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
    Paragraph::new(Line::from(format!(
        "tokentap top  {}  window {} s  {}  frames {}",
        options.addr, options.window, at, frames
    )))
    .style(bold())
}

/// One row per model, over the window.
fn models_table<'a>(listed: &[&'a ModelFigures], frame: Option<&Tick>) -> Table<'a> {
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
            "least-met objective",
        ]
        .map(Cell::from),
    )
    .style(bold());
    let rows: Vec<Row> = listed
        .iter()
        .map(|m| {
            let completed = m.outcomes.get("completed").copied().unwrap_or(0);
            Row::new(vec![
                Cell::from(&*m.model),
                Cell::from(number(Some(m.requests_per_s), 2)),
                Cell::from(secs(m.ttft.p50)),
                Cell::from(secs(m.ttft.p90)),
                Cell::from(secs(m.ttft.p99)),
                Cell::from(secs(m.itl.p50)),
                Cell::from(secs(m.itl.p90)),
                Cell::from(secs(m.itl.p99)),
                Cell::from(number(Some(m.tokens_per_s), 1)),
                Cell::from(m.in_flight.to_string()),
                Cell::from(if m.requests > 0 {
                    format!("{:.1}%", 100.0 * completed as f64 / m.requests as f64)
                } else {
                    "–".into()
                }),
                Cell::from(objectives_cell(m)),
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
        Constraint::Length(24),
    ];
    let skipped = frame.map_or(0, |t| t.models.skipped);
    Table::new(rows, widths).header(header).block(
        Block::default()
            .borders(Borders::ALL)
            .title(titled("per model, over the window".into(), skipped)),
    )
}

/// The slowest requests in flight: longest since their last token (or, with none yet,
/// since their request), then largest gap.
fn streams_table<'a>(frame: Option<&'a Tick>) -> Table<'a> {
    let mut shown_rows: Vec<&StreamFigures> = frame
        .map(|t| t.in_flight.streams.kept.iter().collect())
        .unwrap_or_default();
    let key = |s: &StreamFigures| {
        (
            s.since_last_event_s.unwrap_or(s.elapsed_s),
            s.largest_gap_s.unwrap_or(0.0),
        )
    };
    shown_rows.sort_by(|a, b| {
        key(b)
            .partial_cmp(&key(a))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    let total = frame.map_or(0, |t| t.in_flight.total);
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
    .style(bold());
    let rows: Vec<Row> = shown_rows
        .iter()
        .map(|s| {
            Row::new(vec![
                Cell::from(s.model.as_deref().unwrap_or("–")),
                Cell::from(&*s.tenant),
                Cell::from(phase(&s.phase)),
                Cell::from(secs(Some(s.elapsed_s))),
                Cell::from(s.tokens.to_string()),
                Cell::from(number(s.tokens_per_s, 1)),
                Cell::from(secs(s.largest_gap_s)),
                Cell::from(secs(s.since_last_event_s)),
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
    Table::new(rows, widths)
        .header(header)
        .block(Block::default().borders(Borders::ALL).title(titled(
            format!("slowest requests in flight ({total} now)"),
            frame.map_or(0, |t| t.in_flight.streams.skipped),
        )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    #[test]
    fn w_cycles_the_windows() {
        assert_eq!(next_window(60), 300);
        assert_eq!(next_window(300), 10);
        assert_eq!(next_window(10), 60);
    }

    fn tick(json: &str) -> Tick {
        serde_json::from_str(json).expect("a tick")
    }

    const HOSTILE: &str = r#"{"at_ms": 1000,
        "models": [{"model": "\u001b]0;pwned\u0007m", "requests": 2,
                    "outcomes": {"completed": 1}, "in_flight": 1, "ttft": {"p50": 0.1},
                    "objectives": [{"objective": "\u001b[2Jslo", "met": 1, "missed": 1}]}],
        "in_flight": {"total": 1, "streams": [{"model": "\u009d0;x\u009c",
            "tenant": "\u001b]52;c;cHduZWQ=\u0007", "phase": "\u001b[?1049h",
            "elapsed_s": 1.0}]}}"#;

    #[test]
    fn every_string_of_a_frame_is_shown_safely() {
        let tick = tick(HOSTILE);
        let model = &tick.models.kept[0];
        assert_eq!(&*model.model, "�]0;pwned�m");
        let stream = &tick.in_flight.streams.kept[0];
        let model = stream.model.as_deref().unwrap_or("missing");
        for text in [model, &*stream.tenant, &*stream.phase] {
            assert!(!text.chars().any(char::is_control), "{text:?}");
        }
        assert_eq!(&*stream.phase, "�[?1049h");
    }

    /// What reaches the terminal is the cells ratatui draws: none may hold a control
    /// character, whatever the frame held.
    #[test]
    fn no_cell_drawn_holds_a_control_character() {
        let mut terminal = Terminal::new(TestBackend::new(150, 40)).expect("a test terminal");
        let options = TopOptions {
            addr: "127.0.0.1:1".into(),
            window: 60,
        };
        let frame = tick(HOSTILE);
        terminal
            .draw(|f| draw(f, &options, Some(&frame), 1))
            .expect("drawn");
        let buffer = terminal.backend().buffer();
        let text: String = buffer.content().iter().map(|c| c.symbol()).collect();
        assert!(text.contains("pwned"), "the hostile rows are drawn");
        for cell in buffer.content() {
            assert!(
                !cell.symbol().chars().any(char::is_control),
                "{:?}",
                cell.symbol()
            );
        }
    }

    #[test]
    fn the_least_met_objective_is_shown_with_how_many_more() {
        let row = |objectives: &str| {
            let tick = tick(&format!(
                r#"{{"models": [{{"model": "m", "objectives": [{objectives}]}}]}}"#
            ));
            objectives_cell(&tick.models.kept[0])
        };
        assert_eq!(row(""), "–");
        assert_eq!(
            row(r#"{"objective": "chat", "met": 97, "missed": 3},
                   {"objective": "batch", "met": 5, "missed": 5},
                   {"objective": "idle", "met": 0, "missed": 0}"#),
            "batch 50.0% +1"
        );
        // Counts absent are no share; a negative count makes the frame unreadable.
        assert_eq!(row(r#"{"objective": "x"}"#), "–");
        let negative = r#"{"models": [{"objectives": [{"objective": "x", "met": -5}]}]}"#;
        assert!(serde_json::from_str::<Tick>(negative).is_err());
        let hostile = tick(HOSTILE);
        let cell = objectives_cell(&hostile.models.kept[0]);
        assert_eq!(cell, "�[2Jslo 50.0%");
        let many: Vec<String> = (0..100)
            .map(|i| format!(r#"{{"objective": "o{i}", "met": 1}}"#))
            .collect();
        let tick = tick(&format!(
            r#"{{"models": [{{"objectives": [{}]}}]}}"#,
            many.join(",")
        ));
        assert_eq!(
            tick.models.kept[0].objectives.kept.len(),
            live::MAX_OBJECTIVE_ROWS
        );
    }

    #[test]
    fn rows_past_the_caps_are_counted_not_kept() {
        let models: Vec<String> = (0..1000)
            .map(|i| format!(r#"{{"model": "m{i}", "requests": {i}}}"#))
            .collect();
        let streams: Vec<String> = (0..100)
            .map(|i| format!(r#"{{"tenant": "t{i}"}}"#))
            .collect();
        let tick = tick(&format!(
            r#"{{"models": [{}], "in_flight": {{"total": 100, "streams": [{}]}}}}"#,
            models.join(","),
            streams.join(",")
        ));
        assert_eq!(tick.models.kept.len(), live::MAX_MODEL_ROWS);
        assert_eq!(tick.models.skipped, 1000 - live::MAX_MODEL_ROWS as u64);
        assert_eq!(tick.in_flight.streams.kept.len(), live::MAX_STREAM_ROWS);
        assert_eq!(
            tick.in_flight.streams.skipped,
            100 - live::MAX_STREAM_ROWS as u64
        );
        // The caps are what the live view sends at most: its models, other and unknown.
        assert_eq!(live::MAX_MODEL_ROWS, crate::live::window::MAX_MODELS + 2);
        assert_eq!(live::MAX_STREAM_ROWS, crate::live::IN_FLIGHT_SHOWN);
    }

    #[test]
    fn only_readable_tick_events_are_read_the_latest_kept() {
        let mut reader = TickReader::new();
        // The opening, a `requests` event, a tick cut across two frames.
        assert!(reader
            .feed(b"retry: 2000\n: tokentap live\n\nevent: requests\ndata: {\"requests\": []}\n\n")
            .expect("read")
            .is_none());
        assert!(reader
            .feed(b"event: tick\ndata: {\"at_ms\": 1")
            .expect("read")
            .is_none());
        let tick = reader.feed(b"000}\n\n").expect("read").expect("a tick");
        assert_eq!(tick.at_ms, 1000);
        // Of several ticks in one frame, the latest; an unreadable one is skipped.
        let tick = reader
            .feed(b"event: tick\ndata: {\"at_ms\": 1}\n\nevent: tick\ndata: {\"at_ms\": 2}\n\nevent: tick\ndata: {\"at_ms\": \"x\"}\n\n")
            .expect("read")
            .expect("a tick");
        assert_eq!(tick.at_ms, 2);
    }

    /// A `tick` event whose data line (`data: {...}`) is `len` bytes long.
    fn tick_event_with_data_line(len: usize) -> Vec<u8> {
        let mut line = b"data: {\"models\": [".to_vec();
        line.resize(len - 2, b' ');
        line.extend_from_slice(b"]}");
        [&b"event: tick\n"[..], &line, b"\n\n"].concat()
    }

    #[test]
    fn an_event_past_the_cap_is_refused() {
        let mut reader = TickReader::new();
        let why = reader
            .feed(&tick_event_with_data_line(MAX_EVENT_BYTES + 1))
            .expect_err("refused");
        assert!(why.contains("larger than 1024 KiB"), "{why}");
        // At the cap, the same frame is read.
        let mut reader = TickReader::new();
        let tick = reader
            .feed(&tick_event_with_data_line(MAX_EVENT_BYTES))
            .expect("read");
        assert!(tick.is_some());
    }

    /// A frame that never ends, fed as the network would: refused once it passes the cap,
    /// not buffered on.
    #[test]
    fn an_event_that_never_ends_is_refused_at_the_cap() {
        let mut reader = TickReader::new();
        reader
            .feed(b"event: tick\ndata: {\"models\": [")
            .expect("read");
        let piece = br#"{"model": "endless", "requests": 1}, "#.repeat(1000);
        let mut fed = 0usize;
        let why = loop {
            match reader.feed(&piece) {
                Ok(None) => fed += piece.len(),
                Ok(Some(_)) => panic!("no tick ends"),
                Err(why) => break why,
            }
            assert!(fed <= MAX_EVENT_BYTES, "buffered past the cap");
        };
        assert!(why.contains("larger than"), "{why}");
        // Lines that make no event (comments) are read and dropped: more of them than the
        // cap holds are no event past it.
        let mut reader = TickReader::new();
        for _ in 0..100_000 {
            assert!(reader.feed(b": still here\n").expect("read").is_none());
        }
    }
}
