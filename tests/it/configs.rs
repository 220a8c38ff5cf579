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

/// The URLs the one URL rule refuses (`config::units::parse_http_url`), one of each
/// kind: past 65535, 0, empty and non-numeric ports, no host, no scheme, a scheme other
/// than http/https, credentials, bad percent-escapes, a fragment, a host that is not one.
const INVALID_URLS: [&str; 15] = [
    "http://c:99999",
    "https://[::1]:70000/v1",
    "http://c:0",
    "http://c:",
    "http://c:4x",
    "http://:4318",
    "c:4318",
    "ftp://c:21",
    "http://user:hunter2@c:4318",
    "http://c:4318/a%zz",
    "http://c:4318/a%4",
    "http://c:4318/#top",
    "http://c,d:4318",
    "http://[::g]:4318",
    "not a url",
];

/// `check-config` refuses each invalid URL in every URL key of the file, each error
/// naming its key and line with the rule's own message.
#[test]
fn check_config_refuses_every_invalid_url_in_every_url_key() {
    let bin = env!("CARGO_BIN_EXE_tokentap");
    let path = std::env::temp_dir().join(format!("tokentap-urls-{}.yaml", std::process::id()));
    for url in INVALID_URLS {
        let message = tokentap::config::units::parse_http_url(url).expect_err(url);
        std::fs::write(
            &path,
            format!(
                "upstream:\n  url: '{url}'\notlp:\n  endpoint: '{url}'\n  traces:\n    endpoint: '{url}'\n"
            ),
        )
        .unwrap();
        let out = std::process::Command::new(bin)
            .args(["check-config", path.to_str().unwrap()])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{url}: {stderr}");
        for (at, key) in [
            ("2:3", "upstream.url"),
            ("4:3", "otlp.endpoint"),
            ("6:5", "otlp.traces.endpoint"),
        ] {
            let want = format!("{}:{at}: `{key}`: {message}", path.display());
            assert!(stderr.contains(&want), "{url}: want {want}\n{stderr}");
        }
        assert!(!stderr.contains("hunter2"), "{stderr}");
    }
    let _ = std::fs::remove_file(&path);
}

/// The variables are read at start, not by `check-config`: tokentap refuses to start on
/// each invalid URL in each of them, naming the variable, with the rule's message.
#[test]
fn start_refuses_every_invalid_url_in_every_otlp_endpoint_variable() {
    let bin = env!("CARGO_BIN_EXE_tokentap");
    for url in INVALID_URLS {
        let message = tokentap::config::units::parse_http_url(url).expect_err(url);
        for variable in [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        ] {
            let mut child = std::process::Command::new(bin)
                .args([
                    "--upstream",
                    "http://127.0.0.1:9",
                    "--listen",
                    "127.0.0.1:0",
                    "--admin",
                    "127.0.0.1:0",
                ])
                .env(variable, url)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while child.try_wait().unwrap().is_none() {
                if std::time::Instant::now() > deadline {
                    let _ = child.kill();
                    panic!("{variable}={url}: tokentap started");
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let out = child.wait_with_output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{variable}={url}: {stderr}");
            let want = format!("`${variable}`: {message}");
            assert!(
                stderr.contains(&want),
                "{variable}={url}: want {want}\n{stderr}"
            );
        }
    }
}
