//! The text log's fields, written as tracing-subscriber's default text format writes
//! them, for less.
//!
//! Without colours (a container's log, a file, a pipe), tracing-subscriber's
//! `DefaultFields` still runs every field name and `=` through `nu_ansi_term`'s painting,
//! which then writes no escape: about a third of the access line's cost, a line a
//! request (docs/PERFORMANCE.md). [`PlainFields`] writes `name=value` directly, and
//! hands whatever it does not handle itself (the message, which the default may escape,
//! `log.` metadata, `r#` names, errors, and any output with colours) to tracing-subscriber's
//! own `DefaultVisitor`, so its output is the default's byte for byte; the tests hold
//! the two equal.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing_subscriber::field::{RecordFields, VisitOutput};
use tracing_subscriber::fmt::format::{DefaultVisitor, Writer};
use tracing_subscriber::fmt::FormatFields;

/// A [`FormatFields`] equal to tracing-subscriber's `DefaultFields`, cheaper without
/// colours.
#[derive(Clone, Copy, Debug, Default)]
pub struct PlainFields;

impl<'writer> FormatFields<'writer> for PlainFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        let mut visitor = PlainVisitor {
            writer,
            is_empty: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct PlainVisitor<'a> {
    writer: Writer<'a>,
    /// Nothing written yet: the next field is not preceded by a space.
    is_empty: bool,
    result: fmt::Result,
}

impl PlainVisitor<'_> {
    /// Whether this field is one [`PlainVisitor`] writes itself: an ordinary name, and no
    /// colours to write.
    fn plain(&self, field: &Field) -> bool {
        let name = field.name();
        !self.writer.has_ansi_escapes()
            && name != "message"
            && !name.starts_with("log.")
            && !name.starts_with("r#")
    }

    /// One field: `name=value` after the separating space, as the default writes it
    /// without colours, with `value` writing the value; or, for a field this visitor does
    /// not write itself, `default` recording it with tracing-subscriber's own visitor.
    fn record(
        &mut self,
        field: &Field,
        value: impl FnOnce(&mut Writer<'_>) -> fmt::Result,
        default: impl FnOnce(&mut DefaultVisitor<'_>, &Field),
    ) {
        if self.result.is_err() {
            return;
        }
        if !self.plain(field) {
            return self.delegate(field, default);
        }
        let space = if self.is_empty {
            Ok(())
        } else {
            self.writer.write_char(' ')
        };
        self.is_empty = false;
        self.result = space
            .and_then(|()| self.writer.write_str(field.name()))
            .and_then(|()| self.writer.write_char('='))
            .and_then(|()| value(&mut self.writer));
    }

    /// Hand the field to tracing-subscriber's own visitor, with what was written so far.
    fn delegate(&mut self, field: &Field, record: impl FnOnce(&mut DefaultVisitor<'_>, &Field)) {
        let mut default = DefaultVisitor::new(self.writer.by_ref(), self.is_empty);
        record(&mut default, field);
        self.result = default.finish();
        // The default skips `log.` metadata without writing anything; everything else it
        // writes, so the next field needs its space.
        if !field.name().starts_with("log.") {
            self.is_empty = false;
        }
    }
}

impl Visit for PlainVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.record(
            field,
            |w| write!(w, "{value:?}"),
            |v, f| v.record_str(f, value),
        );
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.record(
            field,
            |w| w.write_str(itoa::Buffer::new().format(value)),
            |v, f| v.record_u64(f, value),
        );
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.record(
            field,
            |w| w.write_str(itoa::Buffer::new().format(value)),
            |v, f| v.record_i64(f, value),
        );
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.record(
            field,
            |w| w.write_str(if value { "true" } else { "false" }),
            |v, f| v.record_bool(f, value),
        );
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        if self.result.is_ok() {
            self.delegate(field, |v, f| v.record_error(f, value));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.record(
            field,
            |w| write!(w, "{value:?}"),
            |v, f| v.record_debug(f, value),
        );
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};

    use proptest::prelude::*;
    use tracing_subscriber::fmt::format::DefaultFields;

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0.lock().expect("buffer").extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// What the text format writes for the events `emit` makes, with `PlainFields` or
    /// with tracing-subscriber's own `DefaultFields`.
    fn written(plain: bool, ansi: bool, emit: &dyn Fn()) -> String {
        let buffer = Buffer::default();
        let out = buffer.clone();
        let builder = tracing_subscriber::fmt()
            .with_writer(move || out.clone())
            .with_ansi(ansi)
            .without_time()
            .with_max_level(tracing::Level::TRACE);
        if plain {
            tracing::subscriber::with_default(builder.fmt_fields(PlainFields).finish(), emit);
        } else {
            tracing::subscriber::with_default(
                builder.fmt_fields(DefaultFields::new()).finish(),
                emit,
            );
        }
        let bytes = buffer.0.lock().expect("buffer").clone();
        String::from_utf8(bytes).expect("UTF-8")
    }

    fn same(emit: &dyn Fn()) {
        for ansi in [false, true] {
            let default = written(false, ansi, emit);
            assert!(!default.is_empty());
            assert_eq!(written(true, ansi, emit), default, "ansi {ansi}");
        }
    }

    #[derive(Debug)]
    struct Failure(&'static str, Option<Box<Failure>>);
    impl fmt::Display for Failure {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for Failure {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn an_access_line_as_the_default_writes_it() {
        same(&|| {
            let none: Option<f64> = None;
            tracing::info!(
                target: "tokentap::access",
                method = %"POST",
                path = %"/v1/chat/completions",
                dialect = "openai_chat",
                model = %"llama",
                tenant = %"acme",
                status = 200u16,
                grpc_status = None::<u32>,
                status_class = "2xx",
                stream = true,
                ttfb_ms = Some(3.25),
                ttft_ms = Some(24.976274999999998),
                mean_itl_ms = none,
                duration_ms = 44.643453,
                output_tokens = 5u64,
                input_tokens = Some(12u64),
                counting = "exact",
                buffered = false,
                "request"
            );
            tracing::info!(
                target: "tokentap::access",
                method = %"GET",
                path = %"/healthz",
                status = 200u16,
                ttfb_ms = None::<f64>,
                "passthrough"
            );
        });
    }

    #[test]
    fn what_it_hands_to_the_default_is_written_as_the_default_writes_it() {
        same(&|| {
            let hostile = "a\"b\\c\nd\u{1b}[31mred\u{7}\u{0}é✓";
            // The message (escaped by the default), `r#` names, `log.` metadata, errors
            // with and without a source, spans' fields, and hostile values everywhere.
            tracing::warn!(r#type = "t", "upstream said {hostile}");
            tracing::warn!(
                error = &Failure("outer", Some(Box::new(Failure("inner", None))))
                    as &(dyn std::error::Error + 'static),
                "failed"
            );
            tracing::warn!(error = &Failure("alone", None) as &(dyn std::error::Error + 'static));
            tracing::info!({ "log.target" } = "x", value = hostile, shown = %hostile, debug = ?hostile);
            let span = tracing::info_span!("conn", peer = %"127.0.0.1:1", id = 7u64);
            let _entered = span.enter();
            span.record("id", 8u64);
            tracing::info!(
                n = -3i64,
                big = u64::MAX,
                small = i64::MIN,
                flag = true,
                "in a span"
            );
            tracing::info!(
                nan = f64::NAN,
                inf = f64::INFINITY,
                tiny = 1e-7,
                huge = 1e21,
                negative_zero = -0.0f64,
                wide = u128::MAX,
            );
            tracing::info!(message = "explicit", after = 1u64);
            tracing::info!(first = 1u64, message = "last");
        });
    }

    proptest! {
        #[test]
        fn any_values_are_written_as_the_default_writes_them(
            text in any::<String>(),
            float in any::<f64>(),
            unsigned in any::<u64>(),
            signed in any::<i64>(),
            flag in any::<bool>(),
        ) {
            let emit = || {
                tracing::info!(
                    target: "tokentap::access",
                    text = text.as_str(),
                    shown = %text,
                    float,
                    unsigned,
                    signed,
                    flag,
                    "request"
                );
            };
            prop_assert_eq!(written(true, false, &emit), written(false, false, &emit));
        }
    }
}
