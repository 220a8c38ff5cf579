//! Reading the timings engines report of their own work into [`EngineTimings`]: each
//! format's unit (seconds, milliseconds, nanoseconds, instants on the engine's clock)
//! becomes a [`Duration`], and what no engine could mean (negative, NaN, infinite, more
//! than [`MAX`]) becomes nothing, so a broken or hostile report is never observed.
//!
//! The dialects say which of their fields are a queue, a prefill or a first-token time;
//! this module only says how a number becomes a duration.

use std::fmt;
use std::time::Duration;

use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::types::EngineTimings;

/// The longest duration read: no request waits or prefills for a day, so a longer one
/// is a unit or clock error, not a figure.
pub(crate) const MAX: Duration = Duration::from_secs(86_400);

/// `v` seconds, when `0 <= v <= MAX`.
pub(crate) fn seconds(v: f64) -> Option<Duration> {
    if !(0.0..=MAX.as_secs_f64()).contains(&v) {
        return None;
    }
    Duration::try_from_secs_f64(v).ok()
}

/// `v` milliseconds, when `0 <= v <= MAX`.
pub(crate) fn millis(v: f64) -> Option<Duration> {
    seconds(v / 1e3)
}

/// `v` nanoseconds, when at most `MAX`.
pub(crate) fn nanos(v: u64) -> Option<Duration> {
    Some(Duration::from_nanos(v)).filter(|d| *d <= MAX)
}

/// The time from instant `from` to instant `to`, both seconds on one clock (the engine's;
/// which epoch does not matter). A 0 is an instant never set (a protobuf default); a
/// negative or non-finite one is no instant, and `to` before `from` is no duration.
pub(crate) fn between(from: f64, to: f64) -> Option<Duration> {
    let instant = |t: f64| t > 0.0 && t.is_finite();
    if !instant(from) || !instant(to) {
        return None;
    }
    seconds(to - from)
}

/// TensorRT-LLM's `PerfMetrics` instants (seconds on the engine's clock): queue from
/// arrival to first scheduled, prefill from first scheduled to first token, and the
/// engine's TTFT from arrival to first token.
pub(crate) fn from_instants(arrival: f64, first_scheduled: f64, first_token: f64) -> EngineTimings {
    EngineTimings {
        queue: between(arrival, first_scheduled),
        prefill: between(first_scheduled, first_token),
        first_token: between(arrival, first_token),
    }
}

/// A JSON number as an `f64`; any other JSON value (`null`, a string, an object ...) is
/// no number, and costs the event nothing.
#[derive(Default)]
pub(crate) struct Float(pub(crate) Option<f64>);

impl<'de> Deserialize<'de> for Float {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct FloatVisitor;
        impl<'de> Visitor<'de> for FloatVisitor {
            type Value = Float;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_f64<E>(self, v: f64) -> Result<Float, E> {
                Ok(Float(Some(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Float, E> {
                Ok(Float(Some(v as f64)))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Float, E> {
                Ok(Float(Some(v as f64)))
            }
            fn visit_str<E>(self, _: &str) -> Result<Float, E> {
                Ok(Float(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Float, E> {
                Ok(Float(None))
            }
            fn visit_unit<E>(self) -> Result<Float, E> {
                Ok(Float(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Float, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Float(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Float, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Float(None))
            }
        }
        de.deserialize_any(FloatVisitor)
    }
}

impl Float {
    /// The number as seconds.
    pub(crate) fn seconds(&self) -> Option<Duration> {
        self.0.and_then(seconds)
    }

    /// The number as milliseconds.
    pub(crate) fn millis(&self) -> Option<Duration> {
        self.0.and_then(millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plausible_durations_are_read() {
        let ms = Duration::from_millis;
        assert_eq!(seconds(0.25), Some(ms(250)));
        assert_eq!(seconds(0.0), Some(Duration::ZERO));
        assert_eq!(millis(12.5), Some(Duration::from_micros(12_500)));
        assert_eq!(nanos(1_500_000), Some(Duration::from_micros(1_500)));
        for hostile in [
            -0.001,
            -1e300,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            86_400.5,
            1e300,
        ] {
            assert_eq!(seconds(hostile), None, "{hostile}");
            assert_eq!(millis(hostile * 1e3), None, "{hostile}");
        }
        assert_eq!(nanos(u64::MAX), None);
        assert_eq!(nanos(86_400_000_000_001), None);
    }

    #[test]
    fn instants_give_their_differences_and_unset_ones_give_nothing() {
        let t = from_instants(1_000.0, 1_000.04, 1_000.15);
        let close = |d: Option<Duration>, ms: f64| {
            d.is_some_and(|d| (d.as_secs_f64() * 1e3 - ms).abs() < 1e-6)
        };
        assert!(close(t.queue, 40.0), "{t:?}");
        assert!(close(t.prefill, 110.0), "{t:?}");
        assert!(close(t.first_token, 150.0), "{t:?}");
        // Not scheduled (0): queue and prefill unknown, the first token still known.
        let t = from_instants(1_000.0, 0.0, 1_000.15);
        assert_eq!((t.queue, t.prefill), (None, None));
        assert!(t.first_token.is_some());
        // Out of order, negative, non-finite, all zero: nothing.
        assert!(from_instants(1_000.0, 999.0, 998.0).is_empty());
        assert!(from_instants(-1.0, -0.5, -0.25).is_empty());
        assert!(from_instants(f64::NAN, f64::INFINITY, 1.0).is_empty());
        assert!(from_instants(0.0, 0.0, 0.0).is_empty());
    }

    #[test]
    fn any_json_value_is_read_without_failing() {
        #[derive(Deserialize)]
        struct T {
            v: Float,
        }
        let read = |json: &str| serde_json::from_str::<T>(json).map(|t| t.v.0);
        assert_eq!(read(r#"{"v":0.5}"#).ok(), Some(Some(0.5)));
        assert_eq!(read(r#"{"v":-3}"#).ok(), Some(Some(-3.0)));
        assert_eq!(read(r#"{"v":7}"#).ok(), Some(Some(7.0)));
        for other in [r#""1.5""#, "null", "true", "[1,2]", r#"{"a":1}"#] {
            assert_eq!(
                read(&format!(r#"{{"v":{other}}}"#)).ok(),
                Some(None),
                "{other}"
            );
        }
    }
}
