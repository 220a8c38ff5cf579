//! `fidelity`: tokentap's access log versus the client's own view of the same requests
//! (paired by the unique `x-tenant-id` each carried), and the simulator's own TTFT versus
//! the client's.

use std::collections::HashMap;
use std::io::BufRead;

use anyhow::Context;

use crate::cli::FidelityArgs;

/// What the client saw of one request.
struct Seen {
    ttft: Option<f64>,
    itl: Option<f64>,
    tokens: u64,
}

pub(crate) fn fidelity(args: &FidelityArgs) -> anyhow::Result<()> {
    let (mut client, mut sim_ttft_diff) = read_client(&args.client)?;
    let client_total = client.len();
    let sim_vs_client = serde_json::json!({
        "p50": quantile(&mut sim_ttft_diff, 0.5),
        "p99": quantile(&mut sim_ttft_diff, 0.99),
        "max": quantile(&mut sim_ttft_diff, 1.0),
    });
    let Some(access) = &args.access else {
        let out = serde_json::json!({
            "client_requests": client_total,
            "sim_ttft_abs_diff_ms": sim_vs_client,
        });
        println!("{out}");
        return Ok(());
    };
    let mut ttft_diff = Vec::new();
    let mut itl_diff = Vec::new();
    let mut ttft_signed = Vec::new();
    let mut mismatches = 0u64;
    let mut counted_mismatches = 0u64;
    let mut paired = 0u64;
    let file =
        std::fs::File::open(access).with_context(|| format!("cannot open {}", access.display()))?;
    for line in std::io::BufReader::new(file).lines() {
        let line = line?;
        if !line.contains("\"ttft_ms\"") && !line.contains("\"output_tokens\"") {
            continue;
        }
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        let Some(tenant) = v["tenant"].as_str() else {
            continue;
        };
        let Some(seen) = client.remove(tenant) else {
            continue;
        };
        paired += 1;
        let tokens = v["output_tokens"].as_u64().unwrap_or(0);
        if tokens != seen.tokens {
            mismatches += 1;
        }
        if let (Some(a), Some(b)) = (v["ttft_ms"].as_f64(), seen.ttft) {
            ttft_diff.push((a - b).abs());
            ttft_signed.push(a - b);
        }
        if let (Some(a), Some(b)) = (v["mean_itl_ms"].as_f64(), seen.itl) {
            itl_diff.push((a - b).abs());
        }
        if v["events"].as_u64().is_some_and(|e| e != seen.tokens) {
            counted_mismatches += 1;
        }
    }
    let out = serde_json::json!({
        "client_requests": client_total,
        "paired": paired,
        "unpaired": client_total as u64 - paired,
        "ttft_abs_diff_ms": {"p50": quantile(&mut ttft_diff, 0.5), "p99": quantile(&mut ttft_diff, 0.99), "max": quantile(&mut ttft_diff, 1.0)},
        "ttft_signed_diff_ms_p50": quantile(&mut ttft_signed, 0.5),
        "mean_itl_abs_diff_ms": {"p50": quantile(&mut itl_diff, 0.5), "p99": quantile(&mut itl_diff, 0.99), "max": quantile(&mut itl_diff, 1.0)},
        "token_mismatches": mismatches,
        "event_count_mismatches": counted_mismatches,
        "sim_ttft_abs_diff_ms": sim_vs_client,
    });
    println!("{out}");
    Ok(())
}

/// The client's log: what it saw of each request, by its tenant, and how far the
/// simulator's own TTFT was from the client's (absolute, in ms).
fn read_client(path: &std::path::Path) -> anyhow::Result<(HashMap<String, Seen>, Vec<f64>)> {
    let mut client: HashMap<String, Seen> = HashMap::new();
    let mut sim_ttft_diff = Vec::new();
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    for line in std::io::BufReader::new(file).lines() {
        let line = line?;
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        let Some(tenant) = v["tenant"].as_str() else {
            continue;
        };
        if let (Some(seen), Some(sim)) = (v["ttft_ms"].as_f64(), v["sim_ttft_ms"].as_f64()) {
            sim_ttft_diff.push((seen - sim).abs());
        }
        client.insert(
            tenant.to_string(),
            Seen {
                ttft: v["ttft_ms"].as_f64(),
                itl: v["mean_itl_ms"].as_f64(),
                tokens: v["usage_tokens"]
                    .as_u64()
                    .unwrap_or(v["tokens"].as_u64().unwrap_or(0)),
            },
        );
    }
    Ok((client, sim_ttft_diff))
}

/// The `q` quantile of `v` (sorted here), rounded to 4 decimals; NaN when empty.
fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let idx = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    (v[idx] * 1e4).round() / 1e4
}
