//! Human-friendly value types for the config file: durations (`150ms`, `5s`, `2m`), byte
//! sizes (`64KiB`, `8MiB`), counts and numbers, each saying in its errors what it expects
//! in words (never a Rust type name). They validate while deserializing, so a bad value is
//! reported with the key path and line:column of the value itself.
//!
//! And the one rule for a URL tokentap connects to ([`parse_http_url`]), which every key,
//! flag and variable holding one is checked by, so that they cannot disagree on what a
//! URL is.

use std::fmt;
use std::net::Ipv6Addr;
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http::Uri;
use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

/// A URL tokentap connects to, as [`parse_http_url`] accepted it.
#[derive(Clone, Debug)]
pub struct HttpUrl {
    pub scheme: Scheme,
    pub authority: Authority,
    /// The whole URL, for its path and query (what each key allows of them is its own).
    pub uri: Uri,
}

/// The rule for every configured URL (`upstream.url` and `--upstream`, `otlp.endpoint`,
/// `otlp.traces.endpoint`, `OTEL_EXPORTER_OTLP_ENDPOINT` and its `_METRICS_` and
/// `_TRACES_` forms): `http://` or `https://`, a host name or an IP address (IPv6 in
/// brackets), a port from 1 to 65535 when one is written (the connector would otherwise
/// fall back to the scheme's port past 65535, and nothing listens on 0), no credentials
/// (they would be printed and logged with the URL; never echoed here either), no fragment,
/// and every `%` followed by two hex digits. The error says what is wrong and quotes the
/// URL (cut short, control characters escaped).
pub fn parse_http_url(text: &str) -> Result<HttpUrl, String> {
    // Before anything quotes the text: the authority is what follows `//` up to the path.
    let after_scheme = text.split_once("//").map_or(text, |(_, rest)| rest);
    let authority_part = after_scheme
        .split(['/', '?', '#'])
        .next()
        .unwrap_or_default();
    if authority_part.contains('@') || (!text.contains("//") && text.contains('@')) {
        return Err("a URL here must not contain credentials (`user:password@`)".to_string());
    }
    let quoted = shown(text);
    if text.contains('#') {
        return Err(format!("`{quoted}` has a fragment (`#...`)"));
    }
    let bytes = text.as_bytes();
    for (at, _) in text.match_indices('%') {
        let hex = bytes.get(at + 1..at + 3);
        if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
            return Err(format!(
                "`{quoted}` has a `%` that is not followed by two hex digits"
            ));
        }
    }
    let uri: Uri = text
        .parse()
        .map_err(|_| format!("`{quoted}` is not a URL"))?;
    let scheme = uri
        .scheme()
        .cloned()
        .ok_or_else(|| format!("`{quoted}` has no scheme (use http:// or https://)"))?;
    if scheme != Scheme::HTTP && scheme != Scheme::HTTPS {
        return Err(format!(
            "scheme `{}` of `{quoted}` is not supported (use http or https)",
            shown(scheme.as_str())
        ));
    }
    let authority = uri
        .authority()
        .cloned()
        .ok_or_else(|| format!("`{quoted}` has no host"))?;
    let host = authority.host();
    if host.is_empty() {
        return Err(format!("`{quoted}` has no host"));
    }
    let host_ok = match host.strip_prefix('[') {
        Some(bracketed) => bracketed
            .strip_suffix(']')
            .is_some_and(|ip| ip.parse::<Ipv6Addr>().is_ok()),
        None => host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')),
    };
    if !host_ok {
        return Err(format!(
            "host `{}` of `{quoted}` is not a host name or an IP address",
            shown(host)
        ));
    }
    if let Some(port) = port_text(&authority) {
        if !matches!(port.parse::<u16>(), Ok(1..)) {
            return Err(format!(
                "port `{}` of `{quoted}` is not a port number from 1 to 65535",
                shown(port)
            ));
        }
    }
    Ok(HttpUrl {
        scheme,
        authority,
        uri,
    })
}

/// The text after the host's `:` (`""` for `host:`), or `None` when no port is written.
/// An IPv6 host is bracketed, so its colons come before the last `]`. (`Authority::port`
/// is `None` for digits past 65535, as if none were written.)
fn port_text(authority: &Authority) -> Option<&str> {
    let text = authority.as_str();
    let host_end = text.rfind(']').map_or(0, |bracket| bracket + 1);
    text[host_end..]
        .rfind(':')
        .map(|colon| &text[host_end + colon + 1..])
}

/// A value in an error, cut short: enough to recognise, never a wall of text, and with
/// its control characters escaped.
pub(super) fn shown(text: &str) -> String {
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == 80 {
            out.push_str("...");
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// A duration written as `<number><unit>` with unit `ms`, `s`, `m` or `h` (a bare number
/// is seconds). Fractions are allowed: `1.5s`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct HumanDuration(pub Duration);

/// Parse `150ms`, `5s`, `2m`, `1h`, `0.25s` or `3` (seconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration (use e.g. 150ms, 5s, 2m)"))?;
    let scale = match unit.trim() {
        "ms" => 1e-3,
        "" | "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(format!(
                "unknown duration unit `{other}` (use ms, s, m or h)"
            ))
        }
    };
    let seconds = value * scale;
    if seconds > 1e9 {
        return Err(format!("duration `{text}` is out of range"));
    }
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("duration `{text}` is out of range"))
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = HumanDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as 150ms, 5s or 2m")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<HumanDuration, E> {
                parse_duration(v).map(HumanDuration).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<HumanDuration, E> {
                Ok(HumanDuration(Duration::from_secs(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<HumanDuration, E> {
                u64::try_from(v)
                    .map(|v| HumanDuration(Duration::from_secs(v)))
                    .map_err(|_| E::custom("a duration cannot be negative"))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<HumanDuration, E> {
                Duration::try_from_secs_f64(v)
                    .ok()
                    .filter(|d| d.as_secs() < 1_000_000_000)
                    .map(HumanDuration)
                    .ok_or_else(|| E::custom("duration out of range"))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A byte size: an integer, or a number with `B`, `KiB`, `MiB`, `GiB` (also `KB`, `MB`, `GB`
/// as powers of 1000).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub usize);

/// Parse `65536`, `64KiB`, `8MiB`, `1GB`.
pub fn parse_size(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a size (use e.g. 65536, 64KiB, 8MiB)"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "unknown size unit `{other}` (use B, KiB, MiB or GiB)"
            ))
        }
    };
    value
        .checked_mul(scale)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| format!("size `{text}` is out of range"))
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size such as 65536, 64KiB or 8MiB")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                parse_size(v).map(ByteSize).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                usize::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom("size out of range"))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                usize::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom("a size cannot be negative"))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A whole number of things (connections, headers, label values, bytes of a value).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Count(pub usize);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Count;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a whole number")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Count, E> {
                usize::try_from(v)
                    .map(Count)
                    .map_err(|_| E::custom("number out of range"))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Count, E> {
                usize::try_from(v)
                    .map(Count)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A number, whole or not (a histogram bucket bound).
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
pub struct Number(pub f64);

impl<'de> Deserialize<'de> for Number {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Number;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Number, E> {
                Ok(Number(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Number, E> {
                Ok(Number(v as f64))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Number, E> {
                Ok(Number(v as f64))
            }
        }
        deserializer.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("150ms"), Ok(Duration::from_millis(150)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("").is_err());
    }

    /// A URL's text is quoted in errors: cut short, its control characters escaped (a
    /// variable may hold anything).
    #[test]
    fn url_errors_quote_the_url_safely() {
        let err = parse_http_url("http://c\u{1b}]0;pwned\u{7}:4318").expect_err("invalid");
        assert!(!err.chars().any(char::is_control), "{err}");
        assert!(err.contains("\\u{1b}]0;pwned\\u{7}"), "{err}");
        let err = parse_http_url(&format!("ftp://{}", "c".repeat(1000))).expect_err("ftp");
        assert!(err.len() < 200, "{err}");
        assert!(err.contains("..."), "{err}");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("65536"), Ok(65536));
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert_eq!(parse_size("8MiB"), Ok(8 << 20));
        assert_eq!(parse_size("1MB"), Ok(1_000_000));
        assert!(parse_size("8 bananas").is_err());
        assert!(parse_size("-1").is_err());
    }
}
