//! Every example in `config/` must parse and validate, and `check-config` must agree.

use std::path::Path;

use tokentap::config::{Config, Overrides};

#[test]
fn every_example_config_is_valid() {
    let mut checked = 0;
    for entry in std::fs::read_dir("config").expect("config/ exists") {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        if let Err(err) = Config::from_file(&path, &Overrides::default()) {
            panic!("{} is invalid:\n{err}", path.display());
        }
        checked += 1;
    }
    assert!(checked > 0, "config/ holds no example");
}

#[test]
fn check_config_command_reports_errors_with_lines() {
    let bin = env!("CARGO_BIN_EXE_tokentap");
    let ok = std::process::Command::new(bin)
        .args(["check-config", "config/sidecar.yaml"])
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );

    let bad = std::env::temp_dir().join(format!("tokentap-bad-{}.yaml", std::process::id()));
    std::fs::write(&bad, "listen: nowhere\nupstream:\n  url: ftp://x\n").unwrap();
    let out = std::process::Command::new(bin)
        .args(["check-config", bad.to_str().unwrap()])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&bad);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(":1:1: `listen`"), "{stderr}");
    assert!(stderr.contains(":3:3: `upstream.url`"), "{stderr}");
    assert!(Path::new("config/gateway.yaml").exists());
}
