//! `tokentap demo` (the README's first command) runs on its own and shows tokentap's
//! figures for every simulated model.

#[test]
fn demo_runs_and_shows_per_model_figures() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tokentap"))
        .args([
            "demo",
            "--duration",
            "4s",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
        ])
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("/metrics"), "{stdout}");
    // A clean exit logs no warning (the demo logs at `warn`, so any would show here).
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("WARN"), "{stderr}");
    // The final summary has rows per model and tenant; each model has measured TTFTs
    // (a pair whose only stream was cut by the demo's end may show "-").
    let summary = stdout.rsplit("tokentap's own figures").next().unwrap();
    for model in ["llama-3.1-8b", "qwen2.5-32b", "mistral-7b"] {
        let ttfts: Vec<f64> = summary
            .lines()
            .filter(|l| l.starts_with(model))
            .filter_map(|row| row.split_whitespace().nth(3)?.parse().ok())
            .collect();
        assert!(!ttfts.is_empty(), "no TTFT for {model}:\n{summary}");
        assert!(
            ttfts.iter().all(|t| *t > 50.0 && *t < 1000.0),
            "{model}: {ttfts:?}"
        );
    }
}
