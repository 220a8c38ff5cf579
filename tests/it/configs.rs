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

#[test]
fn check_config_loads_the_tokenizer_and_reports_every_error() {
    let bin = env!("CARGO_BIN_EXE_tokentap");
    let check = |name: &str, text: &str| {
        let path =
            std::env::temp_dir().join(format!("tokentap-{name}-{}.yaml", std::process::id()));
        std::fs::write(&path, text).unwrap();
        let out = std::process::Command::new(bin)
            .args(["check-config", path.to_str().unwrap()])
            .output()
            .unwrap();
        let _ = std::fs::remove_file(&path);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // The file is valid until the tokenizer it names is loaded.
    let (code, stderr) = check(
        "tokenizer",
        "upstream: http://127.0.0.1:8000\nobserve:\n  tokenizer:\n    file: /nonexistent/tokenizer.json\n",
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains(":4:5: `observe.tokenizer.file`"),
        "{stderr}"
    );
    // A type error and an unknown key in two settings: both reported.
    let (code, stderr) = check("two", "upstream: 8000\nobserve:\n  max_event_byte: 1MiB\n");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains(":1:11: `upstream`"), "{stderr}");
    assert!(
        stderr.contains("a URL, or a mapping with `url`"),
        "{stderr}"
    );
    assert!(
        stderr.contains(":3:3: `observe.max_event_byte`"),
        "{stderr}"
    );
}

/// The OTLP overlay's variables (`components/otlp/otlp.env`, a kustomize env file),
/// applied to the shipped sidecar config as the container gets them: the push goes to the
/// collector and spans are on at the ratio the file's comment states.
#[test]
fn the_otlp_component_turns_on_the_push_and_sampled_spans() {
    let env_file = "deploy/kubernetes/components/otlp/otlp.env";
    let text = std::fs::read_to_string(env_file).expect("the OTLP component's env file");
    let environment = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let (name, value) = line.split_once('=').expect("NAME=value");
            (name.to_string(), value.to_string())
        })
        .collect();
    let overrides = Overrides {
        environment,
        ..Overrides::default()
    };
    let config = Config::from_file(
        Path::new("deploy/kubernetes/base/tokentap.yaml"),
        &overrides,
    )
    .unwrap_or_else(|err| panic!("{env_file} with the base config:\n{err}"));
    let otlp = config.otlp.expect("the push is on");
    assert_eq!(
        otlp.url,
        "http://otel-collector.observability.svc:4318/v1/metrics"
    );
    assert_eq!(otlp.interval, std::time::Duration::from_secs(60));
    let traces = otlp.traces.expect("spans are on");
    assert_eq!(
        traces.url,
        "http://otel-collector.observability.svc:4318/v1/traces"
    );
    assert!(traces.sampler.parent_based);
    assert_eq!(traces.sampler.ratio, 0.1);
    assert!(otlp
        .resource
        .contains(&("service.name".to_string(), "tokentap".to_string())));
}
