//! The loader's contract, end to end: YAML text in, a validated `Config` with the
//! documented defaults out, or every error located by key path and line, no secret echoed.

use super::*;
use std::collections::BTreeSet;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::from_yaml(text, "test.yaml", &Overrides::default())
}

fn issues(text: &str) -> Vec<ConfigIssue> {
    match parse(text) {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(err) => err.issues().to_vec(),
    }
}

/// Validate, then load what the configuration names (the step that reads files).
fn load_issues(text: &str) -> Vec<ConfigIssue> {
    match parse(text).and_then(|config| crate::reload::load_tokenizer(&config)) {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(err) => err.issues().to_vec(),
    }
}

#[test]
fn minimal_config_gets_documented_defaults() {
    let config = parse("upstream:\n  url: http://127.0.0.1:8000\n").expect("valid");
    assert_eq!(config.listen.to_string(), "0.0.0.0:8080");
    assert_eq!(config.admin.to_string(), "0.0.0.0:9464");
    assert_eq!(config.upstream.url(), "http://127.0.0.1:8000");
    assert_eq!(config.upstream.connect_timeout, Duration::from_secs(5));
    assert_eq!(config.upstream.idle_timeout, Duration::from_secs(120));
    assert_eq!(config.shutdown.drain_timeout, Duration::from_secs(30));
    assert_eq!(config.labels.model.max_values, Some(32));
    assert_eq!(config.labels.tenant.max_values, Some(200));
    assert_eq!(config.labels.max_pairs, 250);
    assert!(matches!(&config.tenants[..], [TenantSource::Header(h)] if h == "x-tenant-id"));
    assert_eq!(config.log.format, LogFormat::Text);
}

#[test]
fn unknown_key_is_an_error_with_path_and_line() {
    let found = issues("upstream:\n  url: http://a:1\n  conect_timeout: 5s\n");
    assert_eq!(found.len(), 1);
    let issue = &found[0];
    assert!(issue.path.starts_with("upstream"), "{issue}");
    assert!(issue.message.contains("conect_timeout"), "{issue}");
    assert_eq!(issue.location.map(|l| l.0), Some(3), "{issue}");
}

#[test]
fn bad_duration_names_key_and_line_column() {
    let found = issues("upstream:\n  url: http://a:1\n  idle_timeout: soon\n");
    let issue = &found[0];
    assert_eq!(issue.path, "upstream.idle_timeout");
    assert_eq!(issue.location, Some((3, 17)), "{issue}");
    assert!(issue.message.contains("soon"), "{issue}");
}

#[test]
fn validation_errors_are_all_reported_with_lines() {
    let text = "\
listen: nowhere
upstream:
  url: ftp://example.com
log:
  format: xml
";
    let found = issues(text);
    let paths: Vec<_> = found.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(paths, ["listen", "upstream.url", "log.format"], "{found:?}");
    let lines: Vec<_> = found.iter().map(|i| i.location.map(|l| l.0)).collect();
    assert_eq!(lines, [Some(1), Some(3), Some(5)]);
}

#[test]
fn missing_upstream_is_explained() {
    let found = issues("listen: 127.0.0.1:8080\n");
    assert_eq!(found[0].path, "upstream.url");
    assert!(found[0].message.contains("--upstream"));
}

#[test]
fn upstream_credentials_are_rejected_without_echo() {
    let err = parse("upstream:\n  url: https://user:hunter2@api.example.com\n")
        .expect_err("credentials rejected");
    let text = err.to_string();
    assert!(!text.contains("hunter2"), "{text}");
}

#[test]
fn api_key_tenants_need_hashes_and_never_echo_keys() {
    let err = parse(
        "upstream: {url: 'http://a:1'}\ntenants:\n  sources:\n    - api_keys:\n        sk-live-supersecret: team-a\n",
    )
    .expect_err("raw key rejected");
    let text = err.to_string();
    assert!(text.contains("tenants.sources.0.api_keys"), "{text}");
    assert!(!text.contains("supersecret"), "{text}");

    let hash = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    let config = parse(&format!(
        "upstream: {{url: 'http://a:1'}}\ntenants:\n  sources:\n    - header: x-team\n    - api_keys:\n        {hash}: team-a\n"
    ))
    .expect("valid");
    assert_eq!(config.tenants.len(), 2);
}

#[test]
fn buckets_must_increase() {
    let found = issues(
        "upstream: {url: 'http://a:1'}\nmetrics:\n  buckets:\n    inter_token_latency_seconds: [0.01, 0.005]\n",
    );
    assert_eq!(found[0].path, "metrics.buckets.inter_token_latency_seconds");
    assert_eq!(found[0].location.map(|l| l.0), Some(4));
}

#[test]
fn label_caps_are_bounded_unless_opted_out() {
    let found =
        issues("upstream: {url: 'http://a:1'}\nlabels:\n  tenant:\n    max_values: 5000000\n");
    assert_eq!(found[0].path, "labels.tenant.max_values");
    let config = parse("upstream: {url: 'http://a:1'}\nlabels:\n  tenant:\n    unbounded: true\n")
        .expect("valid");
    assert_eq!(config.labels.tenant.max_values, None);
}

#[test]
fn the_live_view_is_on_unless_switched_off_by_the_file_or_the_flag() {
    let base = "upstream: http://127.0.0.1:8000\n";
    assert!(parse(base).expect("valid").ui);
    let off = parse(&format!("{base}ui:\n  enabled: false\n")).expect("valid");
    assert!(!off.ui);
    let flag = Overrides {
        ui: Some(false),
        ..Overrides::default()
    };
    let config = Config::from_yaml(base, "f", &flag).expect("valid");
    assert!(!config.ui);
    let flag = Overrides {
        ui: Some(true),
        ..Overrides::default()
    };
    let config =
        Config::from_yaml(&format!("{base}ui:\n  enabled: false\n"), "f", &flag).expect("valid");
    assert!(config.ui, "the flag wins over the file");
    let err = parse(&format!("{base}ui:\n  enable: false\n")).expect_err("a typo");
    assert!(err.to_string().contains("ui"), "{err}");
}

#[test]
fn the_live_view_listens_on_loopback_unless_told_otherwise() {
    let base = "upstream: http://127.0.0.1:8000\n";
    let config = parse(base).expect("valid");
    assert_eq!(config.ui_listen, "127.0.0.1:9465".parse().unwrap());
    let file = parse(&format!("{base}ui:\n  listen: 0.0.0.0:7000\n")).expect("valid");
    assert_eq!(file.ui_listen, "0.0.0.0:7000".parse().unwrap());
    let flag = Overrides {
        ui_listen: Some("127.0.0.1:0".into()),
        ..Overrides::default()
    };
    let config = Config::from_yaml(&format!("{base}ui:\n  listen: 0.0.0.0:7000\n"), "f", &flag)
        .expect("valid");
    assert_eq!(
        config.ui_listen,
        "127.0.0.1:0".parse().unwrap(),
        "the flag wins over the file"
    );
    let err = parse(&format!("{base}ui:\n  listen: nowhere\n")).expect_err("not an address");
    let issue = &err.issues()[0];
    assert_eq!(issue.path, "ui.listen");
    assert!(issue.to_string().contains("nowhere"), "{issue}");
}

#[test]
fn flags_override_the_file() {
    let overrides = Overrides {
        upstream: Some("http://10.0.0.1:9000".into()),
        listen: Some("127.0.0.1:1234".into()),
        ..Overrides::default()
    };
    let config = Config::from_yaml(
        "listen: 0.0.0.0:1\nupstream:\n  url: http://a:1\n",
        "f",
        &overrides,
    )
    .expect("valid");
    assert_eq!(config.listen.to_string(), "127.0.0.1:1234");
    assert_eq!(config.upstream.url(), "http://10.0.0.1:9000");
}

#[test]
fn type_errors_are_located() {
    let found = issues("upstream:\n  url: http://a:1\n  http2: maybe\n");
    assert_eq!(found[0].path, "upstream.http2");
    assert_eq!(found[0].location.map(|l| l.0), Some(3));
}

#[test]
fn locate_walks_nested_keys_and_sequences() {
    let text = "a:\n  b: 1\n  c:\n    - x: 1\n    - y: 2\n      z: 3\n";
    assert_eq!(locate::locate(text, "a.b"), Some((2, 3)));
    assert_eq!(locate::locate(text, "a.c.1.z"), Some((6, 7)));
    assert_eq!(locate::locate(text, "a.missing"), None);
}

#[test]
fn upstream_url_forms() {
    let (scheme, authority, base) = parse_upstream_url("https://api.openai.com/v1/").unwrap();
    assert_eq!(
        (scheme.as_str(), authority.as_str(), base.as_str()),
        ("https", "api.openai.com", "/v1")
    );
    assert!(parse_upstream_url("localhost:8000").is_err());
    assert!(parse_upstream_url("http://a:1/?x=1").is_err());
}

#[test]
fn ports_out_of_range_are_located_errors() {
    // (text, key, line:column, what the message quotes)
    let cases = [
        (
            "upstream: http://127.0.0.1:99999\n",
            "upstream.url",
            (1, 1),
            "`99999`",
        ),
        (
            "upstream:\n  url: http://127.0.0.1:0\n",
            "upstream.url",
            (2, 3),
            "`0`",
        ),
        (
            "upstream: {url: 'http://a:65536'}\n",
            "upstream.url",
            (1, 1),
            "`65536`",
        ),
        (
            "upstream: 'https://[::1]:70000/v1'\n",
            "upstream.url",
            (1, 1),
            "`70000`",
        ),
        ("upstream: 'http://a:'\n", "upstream.url", (1, 1), "port ``"),
        (
            "upstream: http://a:1\nlisten: 0.0.0.0:99999\n",
            "listen",
            (2, 1),
            "0.0.0.0:99999",
        ),
        (
            "upstream: http://a:1\nadmin: '127.0.0.1:'\n",
            "admin",
            (2, 1),
            "127.0.0.1:",
        ),
        (
            "upstream: http://a:1\nadmin: '[::1]:65536'\n",
            "admin",
            (2, 1),
            "[::1]:65536",
        ),
    ];
    for (text, key, location, quoted) in cases {
        let found = issues(text);
        assert_eq!(found.len(), 1, "{text:?}: {found:?}");
        assert_eq!(found[0].path, key, "{text:?}");
        assert_eq!(found[0].location, Some(location), "{text:?}: {}", found[0]);
        assert!(found[0].message.contains(quoted), "{text:?}: {}", found[0]);
    }
    let found = issues("upstream: http://127.0.0.1:99999\n");
    assert!(found[0].message.contains("1 to 65535"), "{}", found[0]);
    let err = parse("upstream: http://127.0.0.1:99999\n").expect_err("invalid");
    assert!(
        err.to_string().contains("test.yaml:1:1: `upstream.url`"),
        "{err}"
    );

    // The ends of the range, IPv6 hosts, and no port (the scheme's) are valid; a
    // listener may take port 0 (a free port, as the tests do).
    for (url, port) in [
        ("http://a:1", Some(1)),
        ("http://a:65535", Some(65535)),
        ("http://[::1]:8000/v1", Some(8000)),
        ("http://[::1]", None),
        ("https://api.example.com/v1", None),
    ] {
        let (_, authority, _) = parse_upstream_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_eq!(authority.port_u16(), port, "{url}");
    }
    let config =
        parse("upstream: http://a:1\nlisten: 127.0.0.1:0\nadmin: '[::1]:65535'\n").expect("valid");
    assert_eq!(config.listen.port(), 0);
    assert_eq!(config.admin.port(), 65535);
}

#[test]
fn max_connections_is_derived_at_start_unless_set() {
    let config = parse("upstream: http://a:1\n").expect("valid");
    assert_eq!(config.limits.max_connections, None);
    let config = parse("upstream: http://a:1\nlimits:\n  max_connections: 4\n").expect("valid");
    assert_eq!(config.limits.max_connections, Some(4));
    let found = issues("upstream: http://a:1\nlimits:\n  max_connections: 0\n");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].path, "limits.max_connections");
    assert_eq!(found[0].location, Some((3, 3)));
    assert!(found[0].message.contains("at least 1"), "{}", found[0]);
}

#[test]
fn locate_finds_keys_on_a_sequence_item_line() {
    let text = "\
routes:
  - path_prefix: /a
    dialect: anthropic
  - path_prefix: /b
    dialect: nope
seq_at_key_indent:
- x: 1
- x: 2
observe:
  tokenizer:
    file: /t.json
";
    assert_eq!(locate::locate(text, "routes.0.path_prefix"), Some((2, 5)));
    assert_eq!(locate::locate(text, "routes.1.path_prefix"), Some((4, 5)));
    assert_eq!(locate::locate(text, "routes.1.dialect"), Some((5, 5)));
    assert_eq!(locate::locate(text, "routes.2"), None);
    assert_eq!(locate::locate(text, "seq_at_key_indent.1.x"), Some((8, 3)));
    assert_eq!(
        locate::locate(text, "observe.tokenizer.file"),
        Some((11, 5))
    );
    // Only direct children match: `dialect` is not a key of `routes` itself.
    assert_eq!(locate::locate(text, "routes.dialect"), None);
    assert_eq!(
        locate::locate("upstream:\n  url: http://a:1\n", "upstream.url"),
        Some((2, 3))
    );
}

#[test]
fn routes_force_a_dialect_or_none_first_match_wins() {
    let config = parse(
        "\
upstream: {url: 'http://a:1'}
routes:
  - path_prefix: /my/llm/
    dialect: anthropic
  - path_prefix: /internal
    dialect: none
  - path_prefix: /my
    dialect: ollama
",
    )
    .expect("valid");
    let routes = &config.routes;
    assert_eq!(routes.len(), 3);
    assert_eq!(routes[0].path_prefix, "/my/llm", "trailing slash trimmed");
    assert_eq!(routes[0].dialect, Some(crate::wire::Dialect::Anthropic));
    assert_eq!(routes[1].dialect, None);
    assert!(routes[0].matches("/my/llm"));
    assert!(routes[0].matches("/my/llm/v1/invoke"));
    assert!(!routes[0].matches("/my/llmx"));
    assert!(!routes[0].matches("/my"));
    let root = Route {
        path_prefix: "/".into(),
        dialect: None,
    };
    assert!(root.matches("/anything"));
    // No routes by default.
    assert!(parse("upstream: {url: 'http://a:1'}\n")
        .expect("valid")
        .routes
        .is_empty());
}

#[test]
fn bad_routes_are_located() {
    let found = issues(
        "\
upstream: {url: 'http://a:1'}
routes:
  - path_prefix: /a
    dialect: antropic
  - path_prefix: no-slash
    dialect: tgi
  - path_prefix: /x
    dialect: gemini
  - path_prefix: /x/y
    dialect: tgi
",
    );
    let got: Vec<_> = found
        .iter()
        .map(|i| (i.path.as_str(), i.location.map(|l| l.0)))
        .collect();
    assert_eq!(
        got,
        [
            ("routes.0.dialect", Some(4)),
            ("routes.1.path_prefix", Some(5)),
            ("routes.3.path_prefix", Some(9)),
        ],
        "{found:?}"
    );
    assert!(found[0].message.contains("anthropic"), "{}", found[0]);
    assert!(found[0].message.contains("none"), "{}", found[0]);
    assert!(found[2].message.contains("routes.2"), "{}", found[2]);
    let unknown = issues("upstream: {url: 'http://a:1'}\nroutes:\n  - path_prefix: /a\n    dialect: tgi\n    method: GET\n");
    assert!(unknown[0].message.contains("method"), "{}", unknown[0]);
    assert_eq!(unknown[0].location.map(|l| l.0), Some(5), "{}", unknown[0]);
}

#[test]
fn observe_options_default_off() {
    let config = parse("upstream: {url: 'http://a:1'}\n").expect("valid");
    assert!(!config.observe.skip_special_tokens);
    assert!(config.observe.tokenizer.is_none());
    let config = parse(
        "upstream: {url: 'http://a:1'}\nobserve:\n  skip_special_tokens: true\n  tokenizer:\n    encoding: cl100k_base\n",
    )
    .expect("valid");
    assert!(config.observe.skip_special_tokens);
    let tokenizer = crate::reload::load_tokenizer(&config)
        .expect("loads")
        .expect("tokenizer");
    assert_eq!(tokenizer.name(), "cl100k_base");
    assert_eq!(tokenizer.count("Hello world"), 2);
}

#[test]
fn bad_tokenizers_are_located() {
    let head = "upstream: {url: 'http://a:1'}\nobserve:\n  tokenizer:\n";
    let found = issues(&format!("{head}    encoding: p50k_base\n"));
    assert_eq!(found[0].path, "observe.tokenizer.encoding");
    assert_eq!(found[0].location, Some((4, 5)));
    assert!(found[0].message.contains("o200k_base"), "{}", found[0]);

    let found = issues(&format!(
        "{head}    encoding: o200k_base\n    file: /t.json\n"
    ));
    assert_eq!(found[0].path, "observe.tokenizer");
    assert_eq!(found[0].location, Some((3, 3)));

    let found = load_issues(&format!("{head}    file: /nonexistent/tokenizer.json\n"));
    assert_eq!(found[0].path, "observe.tokenizer.file");
    assert_eq!(found[0].location, Some((4, 5)));
    assert!(
        found[0].message.contains("/nonexistent/tokenizer.json"),
        "{}",
        found[0]
    );
}

#[test]
fn tokenizer_file_needs_the_tokenizers_feature_or_a_valid_file() {
    let path = std::env::temp_dir().join(format!("tokentap-cfg-{}.json", std::process::id()));
    std::fs::write(&path, "{\"not\": \"a tokenizer\"}").expect("temp file");
    let found = load_issues(&format!(
        "upstream: {{url: 'http://a:1'}}\nobserve:\n  tokenizer:\n    file: {}\n",
        path.display()
    ));
    let _ = std::fs::remove_file(&path);
    assert_eq!(found[0].path, "observe.tokenizer.file");
    assert_eq!(found[0].location, Some((4, 5)));
    if cfg!(feature = "tokenizers") {
        assert!(
            found[0].message.contains("not a usable tokenizer.json"),
            "{}",
            found[0]
        );
    } else {
        assert!(
            found[0].message.contains("--features tokenizers"),
            "{}",
            found[0]
        );
    }
}

#[test]
fn upstream_may_be_just_its_url() {
    let config = parse("upstream: http://127.0.0.1:8000\n").expect("valid");
    assert_eq!(config.upstream.url(), "http://127.0.0.1:8000");
    assert_eq!(config.upstream.connect_timeout, Duration::from_secs(5));
    let config = parse("upstream: 'https://api.example.com/v1'\n").expect("valid");
    assert_eq!(config.upstream.url(), "https://api.example.com/v1");
    let found = issues("upstream: ftp://example.com\n");
    assert_eq!(found[0].path, "upstream.url");
}

#[test]
fn wrong_types_say_what_was_expected_in_words() {
    // One wrong-typed value in every section and in the values with their own types.
    let cases = [
        ("listen: [1]\n", "listen"),
        ("upstream: 5\n", "upstream"),
        ("upstream: [http://a:1]\n", "upstream"),
        (
            "upstream:\n  url: http://a:1\n  pool_max_idle_per_host: many\n",
            "upstream.pool_max_idle_per_host",
        ),
        ("tls: yes\n", "tls"),
        ("shutdown: 5\n", "shutdown"),
        ("limits: x\n", "limits"),
        ("limits:\n  max_in_flight: many\n", "limits.max_in_flight"),
        ("limits:\n  max_connections: -4\n", "limits.max_connections"),
        ("limits:\n  max_headers: -1\n", "limits.max_headers"),
        ("tenants: x\n", "tenants"),
        ("tenants:\n  sources: x\n", "tenants.sources"),
        ("tenants:\n  sources:\n    - x\n", "tenants.sources[0]"),
        ("labels: x\n", "labels"),
        ("labels:\n  model: x\n", "labels.model"),
        (
            "labels:\n  tenant:\n    max_value_len: long\n",
            "labels.tenant.max_value_len",
        ),
        ("metrics: x\n", "metrics"),
        ("metrics:\n  buckets: x\n", "metrics.buckets"),
        (
            "metrics:\n  buckets:\n    request_duration_seconds: [fast]\n",
            "metrics.buckets.request_duration_seconds[0]",
        ),
        ("observe: x\n", "observe"),
        ("observe:\n  tokenizer: x\n", "observe.tokenizer"),
        ("routes: x\n", "routes"),
        ("routes:\n  - x\n", "routes[0]"),
        ("log: x\n", "log"),
    ];
    let internal = [
        "Raw", "struct", "usize", "u64", "i64", "f64", "enum", "Option",
    ];
    for (text, path) in cases {
        let found = issues(text);
        let issue = found
            .iter()
            .find(|issue| issue.path == path)
            .unwrap_or_else(|| panic!("no issue at `{path}` for {text:?}: {found:?}"));
        assert!(issue.message.contains("expected"), "{text:?}: {issue}");
        for name in internal {
            assert!(!issue.message.contains(name), "{text:?}: {issue}");
        }
        assert!(issue.location.is_some(), "{text:?}: {issue}");
    }
    // A file of comments only reads as all defaults, like an empty one.
    assert!(parse("# nothing yet\nupstream: http://a:1\n").is_ok());
    assert_eq!(
        issues("# only a comment\n")[0].path,
        "upstream.url",
        "only the missing upstream"
    );
    let found = issues("just some text\n");
    assert!(
        found[0].message.contains("a mapping of settings"),
        "{}",
        found[0]
    );
    let found = issues("upstream: 5\n");
    assert!(
        found[0].message.contains("a URL, or a mapping with `url`"),
        "{}",
        found[0]
    );
}

#[test]
fn every_wrong_setting_is_reported() {
    let text = "\
upstream:
  url: http://a:1
  http2: maybe
listen: nowhere
observe:
  max_event_bytes: 1MiB
  tokenzier: {}
log:
  format: xml
";
    let found = issues(text);
    let got: Vec<_> = found
        .iter()
        .map(|i| (i.path.as_str(), i.location.map(|l| l.0)))
        .collect();
    // Type and key errors first (in file order), then what validation finds in the rest;
    // nothing about the defaults of the sections left out (no "missing upstream.url").
    assert_eq!(
        got,
        [
            ("upstream.http2", Some(3)),
            ("observe.tokenzier", Some(7)),
            ("listen", Some(4)),
            ("log.format", Some(9)),
        ],
        "{found:?}"
    );
    assert!(found[1].message.contains("tokenzier"), "{}", found[1]);
    // A YAML syntax error stops the reading: it is the one issue.
    let found = issues("upstream:\n  url: [unclosed\nlisten: nowhere\n");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(!found[0].message.contains("invalid type"), "{}", found[0]);
    assert_eq!(found[0].location.map(|l| l.0), Some(3), "{}", found[0]);
}

#[test]
fn validation_reads_no_tokenizer_file() {
    let config = parse(
        "upstream: {url: 'http://a:1'}\nobserve:\n  tokenizer:\n    file: /nonexistent/tokenizer.json\n",
    )
    .expect("valid: the file is read only when the tokenizer is loaded");
    let setting = config.observe.tokenizer.as_ref().expect("a tokenizer");
    assert_eq!(
        setting.source,
        crate::wire::tokenize::TokenizerSource::File("/nonexistent/tokenizer.json".into())
    );
    assert_eq!(setting.written.path, "observe.tokenizer.file");
    assert_eq!(setting.written.location, Some((4, 5)));
    let err = crate::reload::load_tokenizer(&config).expect_err("no such file");
    assert!(
        err.to_string()
            .contains("test.yaml:4:5: `observe.tokenizer.file`"),
        "{err}"
    );
}

#[test]
fn native_histograms_default_to_schema_3_and_take_a_factor_or_a_schema() {
    let config = parse("upstream: http://a:1\n").expect("valid");
    assert_eq!(
        config.metrics.native_histograms,
        NativeHistograms {
            enabled: true,
            schema: 3,
            max_buckets: 160,
            classic: true,
        }
    );
    let base = "upstream: http://a:1\nmetrics:\n  native_histograms:\n";
    let config = parse(&format!("{base}    factor: 2\n    classic: false\n")).expect("valid");
    assert_eq!(config.metrics.native_histograms.schema, 0);
    assert!(!config.metrics.native_histograms.classic);
    let config = parse(&format!("{base}    schema: -2\n    enabled: false\n")).expect("valid");
    assert_eq!(config.metrics.native_histograms.schema, -2);
    assert!(!config.metrics.native_histograms.enabled);

    for (settings, path, line, message) in [
        ("factor: 1.1\n    schema: 3", "schema", 5, "not both"),
        ("factor: 1", "factor", 4, "greater than 1"),
        ("schema: 9", "schema", 4, "from -4 to 8"),
        ("max_buckets: 0", "max_buckets", 4, "at least 1"),
        (
            "enabled: false\n    classic: false",
            "classic",
            5,
            "no buckets",
        ),
    ] {
        let found = issues(&format!("{base}    {settings}\n"));
        assert_eq!(found.len(), 1, "{settings}: {found:?}");
        assert_eq!(found[0].path, format!("metrics.native_histograms.{path}"));
        assert!(found[0].message.contains(message), "{}", found[0].message);
        assert_eq!(found[0].location.map(|l| l.0), Some(line), "{settings}");
    }
}

#[test]
fn tenant_families_default_to_the_per_tenant_slo_families() {
    let config = parse("upstream: http://a:1\n").expect("valid");
    let expected = BTreeSet::from([
        "tokentap_requests_total",
        "tokentap_output_tokens_total",
        "tokentap_input_tokens_total",
        "tokentap_event_tokens_total",
        "tokentap_time_to_first_token_seconds",
        "tokentap_inter_token_latency_seconds",
    ]);
    assert_eq!(config.labels.tenant_families, expected);

    let narrowed = parse(
        "upstream: http://a:1\nlabels:\n  tenant:\n    max_values: 10\n    families:\n      \
         - tokentap_requests_total\n      - tokentap_request_duration_seconds\n",
    )
    .expect("valid");
    assert_eq!(
        narrowed.labels.tenant_families,
        BTreeSet::from([
            "tokentap_requests_total",
            "tokentap_request_duration_seconds"
        ])
    );
    assert_eq!(narrowed.labels.tenant.max_values, Some(10));
    let none =
        parse("upstream: http://a:1\nlabels:\n  tenant:\n    families: []\n").expect("valid");
    assert!(none.labels.tenant_families.is_empty());
}

#[test]
fn tenant_families_must_be_per_request_families_named_once() {
    let text = "\
upstream: http://a:1
labels:
  tenant:
    families:
      - tokentap_requests_total
      - tokentap_request_durations
      - tokentap_streams_in_flight
      - tokentap_requests_total
";
    let found = issues(text);
    assert_eq!(found.len(), 3, "{found:?}");
    assert_eq!(found[0].path, "labels.tenant.families.1");
    assert_eq!(found[0].location, Some((6, 7)), "{}", found[0]);
    assert!(
        found[0]
            .message
            .contains("`tokentap_request_durations` is not a tokentap metric family")
            && found[0]
                .message
                .contains("`tokentap_request_duration_seconds`"),
        "{}",
        found[0]
    );
    assert_eq!(found[1].path, "labels.tenant.families.2");
    assert_eq!(found[1].location.map(|l| l.0), Some(7));
    assert!(
        found[1].message.contains("can never carry `tenant`"),
        "{}",
        found[1]
    );
    assert_eq!(found[2].path, "labels.tenant.families.3");
    assert_eq!(found[2].location.map(|l| l.0), Some(8));
    assert!(found[2].message.contains("listed twice"), "{}", found[2]);

    // A flow-style list: located at the key.
    let found = issues("upstream: http://a:1\nlabels:\n  tenant:\n    families: [tokentap_x]\n");
    assert_eq!(found[0].path, "labels.tenant.families.0");
    assert_eq!(found[0].location, Some((4, 5)), "{}", found[0]);

    // `model` is on every family: nothing to choose.
    let found = issues(
        "upstream: http://a:1\nlabels:\n  model:\n    families: [tokentap_requests_total]\n",
    );
    assert_eq!(found[0].path, "labels.model.families");
    assert_eq!(found[0].location.map(|l| l.0), Some(4));
    assert!(
        found[0].message.contains("labels.tenant.families"),
        "{}",
        found[0]
    );
}

#[test]
fn exemplars_read_traceparent_by_default_and_take_a_valid_header_name() {
    let config = parse("upstream: http://a:1\n").expect("valid");
    assert_eq!(config.metrics.exemplars, Exemplars::default());
    assert!(config.metrics.exemplars.enabled);
    assert_eq!(config.metrics.exemplars.header.as_str(), "traceparent");
    let base = "upstream: http://a:1\nmetrics:\n  exemplars:\n";
    let config = parse(&format!(
        "{base}    enabled: false\n    header: X-B3-Parent\n"
    ))
    .expect("valid");
    assert!(!config.metrics.exemplars.enabled);
    assert_eq!(config.metrics.exemplars.header.as_str(), "x-b3-parent");

    let found = issues(&format!(
        "{base}    enabled: true\n    header: \"bad header\"\n"
    ));
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].path, "metrics.exemplars.header");
    assert!(
        found[0].message.contains("not a valid header name"),
        "{}",
        found[0].message
    );
    assert_eq!(found[0].location.map(|l| l.0), Some(5));
    let found = issues(&format!("{base}    sample_rate: 1\n"));
    assert_eq!(found.len(), 1, "unknown key: {found:?}");
}

#[test]
fn the_http1_fast_path_is_on_unless_switched_off() {
    let base = "upstream: http://127.0.0.1:8000\n";
    assert!(parse(base).expect("valid").proxy.http1_fast_path);
    let off = parse(&format!("{base}proxy:\n  http1_fast_path: false\n")).expect("valid");
    assert!(!off.proxy.http1_fast_path);
    let found = issues(&format!("{base}proxy:\n  http1_fastpath: true\n"));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].path.starts_with("proxy"), "{}", found[0].path);
}

#[test]
fn http2_goes_with_either_scheme() {
    // h2c with prior knowledge, or h2 required of TLS's ALPN.
    for url in ["http://a:1", "https://a"] {
        let text = format!("upstream:\n  url: {url}\n  http2: true\n");
        let config = parse(&text).unwrap_or_else(|err| panic!("{url}: {err}"));
        assert!(config.upstream.http2, "{url}");
    }
}

#[test]
fn metric_names_default_to_tokentap_and_name_the_key_when_wrong() {
    let config = parse("upstream: http://a:1\n").expect("valid");
    assert_eq!(config.metrics.names, MetricNames::Tokentap);
    for (written, names) in [
        ("tokentap", MetricNames::Tokentap),
        ("gen_ai", MetricNames::GenAi),
        ("both", MetricNames::Both),
    ] {
        let config = parse(&format!(
            "upstream: http://a:1\nmetrics:\n  names: {written}\n"
        ))
        .expect("valid");
        assert_eq!(config.metrics.names, names);
    }
    for wrong in ["genai", "GEN_AI", "otel", "''"] {
        let found = issues(&format!(
            "upstream: http://a:1\nmetrics:\n  names: {wrong}\n"
        ));
        assert_eq!(found.len(), 1, "{wrong}: {found:?}");
        assert_eq!(found[0].path, "metrics.names");
        assert_eq!(found[0].location.map(|l| l.0), Some(3), "{wrong}");
        assert!(
            found[0].message.contains("tokentap, gen_ai, both"),
            "{}",
            found[0].message
        );
    }
}

/// URLs every URL key refuses, with what the message must say.
const INVALID_URLS: &[(&str, &str)] = &[
    (
        "http://c:99999",
        "port `99999` of `http://c:99999` is not a port number from 1 to 65535",
    ),
    ("http://c:65536/v1", "port `65536`"),
    ("https://[::1]:70000", "port `70000`"),
    ("http://c:0", "port `0`"),
    ("http://c:", "port ``"),
    ("http://c:4x", "port `4x`"),
    ("http://:4318", "has no host"),
    ("http://", "not a URL"),
    ("c:4318", "no scheme"),
    ("/v1/metrics", "no scheme"),
    ("ftp://c:21", "scheme `ftp`"),
    ("unix://c", "scheme `unix`"),
    ("http://user:hunter2@c:4318", "credentials"),
    ("http://token@c", "credentials"),
    ("user:hunter2@c:4318", "credentials"),
    ("http://c:4318/a%zz", "two hex digits"),
    ("http://c:4318/a%4", "two hex digits"),
    ("http://c%4:4318", "two hex digits"),
    ("http://c%41:4318", "not a URL"),
    ("http://c:4318/#top", "fragment"),
    ("http://c d:4318", "not a URL"),
    ("http://c,d:4318", "host `c,d`"),
    ("http://[::g]:4318", "host `[::g]`"),
    ("not a url", "not a URL"),
];

/// URLs every URL key accepts.
const VALID_URLS: &[&str] = &[
    "http://c",
    "http://c:1",
    "https://c:65535/",
    "http://[::1]:4318",
    "http://10.0.0.1:8000",
];

/// A key that holds a URL: the file with the URL at `{url}`, the variable, whether it is
/// the `--upstream` flag, the key or variable an error names, and its line.
type UrlKey = (
    &'static str,
    Option<&'static str>,
    bool,
    &'static str,
    Option<usize>,
);

const URL_KEYS: &[UrlKey] = &[
    (
        "upstream:\n  url: '{url}'\n",
        None,
        false,
        "upstream.url",
        Some(2),
    ),
    ("upstream: '{url}'\n", None, false, "upstream.url", Some(1)),
    ("{}\n", None, true, "upstream.url", None),
    (
        "upstream: http://a:1\notlp:\n  endpoint: '{url}'\n",
        None,
        false,
        "otlp.endpoint",
        Some(3),
    ),
    (
        "upstream: http://a:1\notlp:\n  protocol: grpc\n  endpoint: '{url}'\n",
        None,
        false,
        "otlp.endpoint",
        Some(4),
    ),
    (
        "upstream: http://a:1\notlp:\n  traces:\n    endpoint: '{url}'\n",
        None,
        false,
        "otlp.traces.endpoint",
        Some(4),
    ),
    (
        "upstream: http://a:1\n",
        Some("OTEL_EXPORTER_OTLP_ENDPOINT"),
        false,
        "$OTEL_EXPORTER_OTLP_ENDPOINT",
        None,
    ),
    (
        "upstream: http://a:1\n",
        Some("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"),
        false,
        "$OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        None,
    ),
    (
        "upstream: http://a:1\n",
        Some("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        false,
        "$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        None,
    ),
];

/// The config with `url` in `key`.
fn load_with_url(key: &UrlKey, url: &str) -> Result<Config, ConfigError> {
    let (file, variable, flag, _, _) = *key;
    let overrides = Overrides {
        upstream: flag.then(|| url.to_string()),
        environment: variable
            .map(|name| (name.to_string(), url.to_string()))
            .into_iter()
            .collect(),
        ..Overrides::default()
    };
    Config::from_yaml(&file.replace("{url}", url), "test.yaml", &overrides)
}

/// One URL rule: every key, flag and variable that holds a URL refuses the same URLs with
/// the same message ([`units::parse_http_url`]'s), naming itself and, in the file, its
/// line; and accepts the same valid ones.
#[test]
fn every_url_key_follows_the_one_url_rule() {
    for &(url, says) in INVALID_URLS {
        let rule = units::parse_http_url(url).expect_err(url);
        assert!(rule.contains(says), "{url}: {rule}");
        assert!(!rule.contains("hunter2"), "{url}: {rule}");
        for key in URL_KEYS {
            let (_, _, _, named, line) = *key;
            let found = match load_with_url(key, url) {
                Ok(_) => panic!("{named} accepted {url:?}"),
                Err(err) => err.issues().to_vec(),
            };
            assert_eq!(found.len(), 1, "{named} {url:?}: {found:?}");
            assert_eq!(found[0].path, named, "{url:?}");
            assert_eq!(found[0].location.map(|l| l.0), line, "{named} {url:?}");
            assert_eq!(found[0].message, rule, "{named} {url:?}");
        }
    }
    for &url in VALID_URLS {
        for key in URL_KEYS {
            if let Err(err) = load_with_url(key, url) {
                panic!("{} refused {url:?}: {err}", key.3);
            }
        }
    }
}

#[test]
fn objectives_are_validated_and_each_bad_one_named_with_its_line() {
    let config = parse(
        "upstream: http://a:1\nobjectives:\n  chat:\n    ttft: 500ms\n    tpot: 50ms\n    \
         overrides:\n      - tenant: acme\n        ttft: 300ms\n",
    )
    .expect("valid");
    let objectives = config.objectives.expect("one objective");
    assert_eq!(objectives.len(), 1);
    let chat = &objectives[0];
    assert_eq!(chat.name, "chat");
    assert_eq!(chat.target, 0.95);
    assert_eq!(
        chat.bounds_for("m", "acme").ttft,
        Some(Duration::from_millis(300))
    );
    assert_eq!(
        chat.bounds_for("m", "acme").tpot,
        Some(Duration::from_millis(50))
    );
    assert!(parse("upstream: http://a:1\n")
        .expect("valid")
        .objectives
        .is_none());

    // (text after `objectives:`, key path, line, what the message says)
    for (text, path, line, says) in [
        (
            "\n  Chat:\n    ttft: 1s\n",
            "objectives.Chat",
            3,
            "label value",
        ),
        (
            "\n  chat:\n    target: 0.9\n",
            "objectives.chat",
            3,
            "at least one bound",
        ),
        (
            "\n  chat:\n    ttft: 0s\n",
            "objectives.chat.ttft",
            4,
            "longer than 0",
        ),
        (
            "\n  chat:\n    ttft: 1s\n    target: 1.5\n",
            "objectives.chat.target",
            5,
            "share",
        ),
        (
            "\n  chat:\n    ttft: 1s\n    overrides:\n      - ttft: 2s\n",
            "objectives.chat.overrides.0",
            6,
            "names a `model`",
        ),
        (
            "\n  chat:\n    ttft: 1s\n    overrides:\n      - tenant: a\n        ttft: 2s\n      \
             - tenant: a\n        tpot: 2s\n",
            "objectives.chat.overrides.1",
            8,
            "same model and tenant",
        ),
    ] {
        let found = issues(&format!("upstream: http://a:1\nobjectives:{text}"));
        assert_eq!(found.len(), 1, "{text}: {found:?}");
        assert_eq!(found[0].path, path, "{text}");
        assert_eq!(
            found[0].location.map(|l| l.0),
            Some(line),
            "{text}: {}",
            found[0]
        );
        assert!(found[0].message.contains(says), "{text}: {}", found[0]);
    }
    let nine: String = (0..9).map(|i| format!("\n  o{i}:\n    ttft: 1s")).collect();
    let found = issues(&format!("upstream: http://a:1\nobjectives:{nine}\n"));
    assert!(
        found
            .iter()
            .any(|i| i.path == "objectives" && i.message.contains("at most 8")),
        "{found:?}"
    );
}
