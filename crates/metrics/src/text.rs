//! Primitives of the Prometheus text format (0.0.4) shared by the per-pair encoder
//! (`exposition`) and the per-pair storage (`series`, which escapes its label text once):
//! label and help escaping, and numbers printed exactly as the prometheus crate printed
//! them; and where the OpenMetrics text (1.0.0) differs: its help escaping, its spelling of
//! infinities, and its canonical `le` values. A leaf: it imports nothing from the rest of
//! `metrics`.

/// Escape a label value as the exposition format (and the prometheus crate) does.
pub(super) fn escape_label_value(value: &str, out: &mut String) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Escape a HELP text (backslash and newline only).
pub(super) fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Escape an OpenMetrics HELP text: backslash, newline and double quote.
pub(super) fn escape_openmetrics_help(help: &str) -> String {
    help.replace('\\', "\\\\")
        .replace('\n', "\\n")
        .replace('"', "\\\"")
}

/// `v` as [`push_f64`] prints it, but with OpenMetrics' `+Inf` and `-Inf`.
pub(super) fn push_openmetrics_f64(out: &mut Vec<u8>, v: f64) {
    if v.is_infinite() {
        out.extend_from_slice(if v > 0.0 { b"+Inf" } else { b"-Inf" });
    } else {
        push_f64(out, v);
    }
}

/// A bucket bound as OpenMetrics' canonical `le` value, exactly as Prometheus writes a
/// bound it reads from the protobuf format (Go's `%g` with the shortest digits, `.0`
/// added to an integer), so that both formats name the same series: `1.0`, `0.005`,
/// `2000.0`, `1e+06`, `1e-05`, `+Inf`.
pub(super) fn openmetrics_le(bound: f64) -> String {
    if bound.is_infinite() {
        return if bound > 0.0 { "+Inf" } else { "-Inf" }.to_string();
    }
    if bound.is_nan() {
        return "NaN".to_string();
    }
    // Rust's `{:e}` has the same shortest digits: `d[.ddd]e<exp>`.
    let scientific = format!("{bound:e}");
    let (mantissa, exponent): (&str, i32) = scientific
        .split_once('e')
        .map_or((scientific.as_str(), 0), |(m, e)| {
            (m, e.parse().unwrap_or(0))
        });
    if !(-4..6).contains(&exponent) {
        let sign = if exponent < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exponent.unsigned_abs());
    }
    let mut out = Vec::new();
    push_f64(&mut out, bound);
    let mut text = String::from_utf8_lossy(&out).into_owned();
    if !text.contains('.') {
        text.push_str(".0");
    }
    text
}

/// Integers up to 2^53 are exact in an `f64`: above, the crate printed the rounded float.
const EXACT_INTEGERS: u64 = 1 << 53;

/// A count, printed as the crate printed it: the `u64` converted to `f64`, `Display`ed.
pub(super) fn push_count(out: &mut Vec<u8>, n: u64) {
    if n <= EXACT_INTEGERS {
        out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    } else {
        push_f64(out, n as f64);
    }
}

/// `v` exactly as `f64`'s `Display` (`v.to_string()`) prints it: the shortest digits that
/// round-trip, never an exponent, no `.0` on integers; `NaN`, `inf`, `-inf`, `-0`.
///
/// `ryu` finds the same shortest digits (several times faster than `Display`); only their
/// layout differs (`1e-7`, `1.5e300`, `12.0`), so this re-lays them out.
pub(super) fn push_f64(out: &mut Vec<u8>, v: f64) {
    if v.is_nan() {
        out.extend_from_slice(b"NaN");
        return;
    }
    if v.is_infinite() {
        out.extend_from_slice(if v > 0.0 { b"inf" } else { b"-inf" });
        return;
    }
    if v.is_sign_negative() {
        out.push(b'-');
    }
    let magnitude = v.abs();
    if magnitude.trunc() == magnitude && magnitude < EXACT_INTEGERS as f64 {
        out.extend_from_slice(itoa::Buffer::new().format(magnitude as u64).as_bytes());
        return;
    }
    let mut buffer = ryu::Buffer::new();
    let text = buffer.format_finite(magnitude).as_bytes();
    let (mantissa, exponent) = match text.iter().position(|&c| c == b'e') {
        Some(e) => (&text[..e], parse_exponent(&text[e + 1..])),
        None => (text, 0),
    };
    // The value is 0.DIGITS x 10^point.
    let mut digits = [0u8; 24];
    let mut len = 0;
    let mut point = None;
    for &c in mantissa {
        if c == b'.' {
            point = Some(len);
        } else if len < digits.len() {
            digits[len] = c;
            len += 1;
        }
    }
    let mut point = point.unwrap_or(len) as i32 + exponent;
    let mut first = 0;
    while first + 1 < len && digits[first] == b'0' {
        first += 1;
        point -= 1;
    }
    while len > first + 1 && digits[len - 1] == b'0' {
        len -= 1;
    }
    let last = len - 1;
    if digits[last] & 1 == 0 {
        // Between two equally near shortest candidates `ryu` takes the even digit,
        // `Display` the higher one (an even digit plus one never carries).
        let d = digits[first..len]
            .iter()
            .fold(0u64, |n, c| n * 10 + u64::from(c - b'0'));
        if is_midpoint(magnitude, d, point - (len - first) as i32) {
            digits[last] += 1;
        }
    }
    let digits = &digits[first..len];
    if point <= 0 {
        out.extend_from_slice(b"0.");
        out.resize(out.len() + point.unsigned_abs() as usize, b'0');
        out.extend_from_slice(digits);
    } else if (point as usize) < digits.len() {
        let (int, frac) = digits.split_at(point as usize);
        out.extend_from_slice(int);
        out.push(b'.');
        out.extend_from_slice(frac);
    } else {
        out.extend_from_slice(digits);
        out.resize(out.len() + point as usize - digits.len(), b'0');
    }
}

/// Whether the positive finite `v` is exactly `(d + 1/2) x 10^q`.
fn is_midpoint(v: f64, d: u64, q: i32) -> bool {
    // v = odd x 2^exp.
    let bits = v.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    let fraction = bits & ((1 << 52) - 1);
    let (mantissa, exp) = if biased == 0 {
        (fraction, -1074)
    } else {
        (fraction | (1 << 52), biased - 1075)
    };
    let zeros = mantissa.trailing_zeros();
    let (odd, exp) = (u128::from(mantissa >> zeros), exp + zeros as i32);
    // (d + 1/2) x 10^q = (2d + 1) x 5^q x 2^(q - 1), with 2d + 1 odd.
    let twice = u128::from(d) * 2 + 1;
    if q >= 0 {
        exp == q - 1
            && 5u128
                .checked_pow(q.unsigned_abs())
                .and_then(|p| p.checked_mul(twice))
                == Some(odd)
    } else {
        exp == q - 1
            && 5u128
                .checked_pow(q.unsigned_abs())
                .is_some_and(|p| twice % p == 0 && twice / p == odd)
    }
}

fn parse_exponent(text: &[u8]) -> i32 {
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    let magnitude = digits
        .iter()
        .fold(0i32, |n, d| n * 10 + i32::from(d.wrapping_sub(b'0')));
    if negative {
        -magnitude
    } else {
        magnitude
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    fn f64_text(v: f64) -> String {
        let mut out = Vec::new();
        push_f64(&mut out, v);
        String::from_utf8(out).expect("ascii")
    }

    #[test]
    fn floats_print_like_display() {
        let fixed = [
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.1,
            0.25,
            1e-7,
            1.5e-300,
            5e-324,
            f64::MIN_POSITIVE,
            123.456,
            1e15,
            1e16,
            1e17,
            1e21,
            1.5e300,
            f64::MAX,
            -f64::MAX,
            9007199254740992.0,
            9007199254740993.0,
            4503599627370495.5,
            0.005,
            0.3,
            2.0 / 3.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ];
        for v in fixed {
            assert_eq!(f64_text(v), v.to_string(), "{v:e}");
        }
        let mut rng = SmallRng::seed_from_u64(7);
        for _ in 0..200_000 {
            // Any bit pattern, and sums of durations in seconds (the usual `_sum`).
            let any = f64::from_bits(rng.gen());
            assert_eq!(f64_text(any), any.to_string(), "{any:e}");
            let seconds = rng.gen_range(0..10_000_000_000u64) as f64 * 1e-9
                + rng.gen_range(0..1000u64) as f64 * 1e-3;
            assert_eq!(f64_text(seconds), seconds.to_string(), "{seconds:e}");
            // Few fraction bits: the decimal expansion is short, so ties between two
            // shortest candidates are common.
            let dyadic = rng.gen_range(0..1u64 << 53) as f64 / f64::from(1 << rng.gen_range(0..12));
            assert_eq!(f64_text(dyadic), dyadic.to_string(), "{dyadic:e}");
            let scaled = dyadic * 2f64.powi(rng.gen_range(-80..80));
            assert_eq!(f64_text(scaled), scaled.to_string(), "{scaled:e}");
        }
    }

    #[test]
    fn openmetrics_spellings() {
        assert_eq!(
            escape_openmetrics_help("a \\ \"b\"\nc"),
            "a \\\\ \\\"b\\\"\\nc"
        );
        for (v, text) in [
            (f64::INFINITY, "+Inf"),
            (f64::NEG_INFINITY, "-Inf"),
            (0.25, "0.25"),
        ] {
            let mut out = Vec::new();
            push_openmetrics_f64(&mut out, v);
            assert_eq!(String::from_utf8(out).unwrap(), text);
        }
        // What Go's `strconv.FormatFloat(f, 'g', -1, 64)` (plus `.0`) gives.
        for (bound, le) in [
            (1.0, "1.0"),
            (0.0, "0.0"),
            (300.0, "300.0"),
            (0.005, "0.005"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (2.5, "2.5"),
            (123456.0, "123456.0"),
            (1e6, "1e+06"),
            (1.25e6, "1.25e+06"),
            (1e100, "1e+100"),
            (f64::INFINITY, "+Inf"),
        ] {
            assert_eq!(openmetrics_le(bound), le);
        }
    }

    #[test]
    fn counts_print_like_the_float_they_were() {
        for n in [
            0,
            1,
            10,
            1 << 53,
            (1 << 53) + 1,
            u64::MAX,
            12345678901234567890,
        ] {
            let mut out = Vec::new();
            push_count(&mut out, n);
            assert_eq!(String::from_utf8(out).unwrap(), (n as f64).to_string());
        }
    }
}
