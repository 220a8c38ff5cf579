//! The documentation's facts, held to the code (issue 35): every configuration key the
//! parser accepts is in docs/CONFIGURATION.md with the default the code uses, every flag
//! and environment variable of every command is documented and nothing documented is
//! unknown, every alert of deploy/prometheus/rules.yaml is in deploy/README.md with the
//! thresholds and recording rules it reads, README keeps its two commands, the bench
//! counts docs/PERFORMANCE.md gives as "now" are benches/budget.toml's, and every
//! relative link between the repository's Markdown files resolves, file and `#anchor`.
//! (The metric families and the (outcome, status) pairs of docs/METRICS.md are checked
//! in the library, `metrics_contract`, against the metrics crate's tables.)
//!
//! Each check reads the code's own view where it can: the parser is asked which keys it
//! accepts (its "unknown field, expected one of" answer), the binary's `--help` which flags
//! and variables it reads, and a default is checked by loading a file that writes it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use tokentap::config::{Config, Overrides};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The cells of a Markdown table row (`\|` inside a cell is a literal `|`).
fn cells(row: &str) -> Vec<String> {
    let inner = row.trim().trim_start_matches('|').trim_end_matches('|');
    let mut out = vec![String::new()];
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                out.last_mut().unwrap().push('|');
                chars.next();
            }
            '|' => out.push(String::new()),
            _ => out.last_mut().unwrap().push(c),
        }
    }
    out.iter().map(|c| c.trim().to_string()).collect()
}

/// The rows (as cells) of every table in `text` whose header row starts with `header`.
fn tables(text: &str, header: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with(header) {
            inside = true;
            continue;
        }
        if !line.starts_with('|') {
            inside = false;
            continue;
        }
        if inside && !line.starts_with("|---") {
            rows.push(cells(line));
        }
    }
    rows
}

/// The text of every code span in `cell`.
fn code_spans(cell: &str) -> Vec<String> {
    cell.split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, s)| s.to_string())
        .collect()
}

/// A cell that is exactly one code span: its text.
fn literal(cell: &str) -> Option<&str> {
    let inner = cell.strip_prefix('`')?.strip_suffix('`')?;
    (!inner.contains('`')).then_some(inner)
}

// ---------------------------------------------------------------------------------------
// Configuration keys

const PROBE: &str = "__probe";

/// The YAML text that writes `value` at `path` (segments; `name[]` is a list of mappings).
fn nested(path: &[String], value: &str) -> String {
    let mut text = value.to_string();
    for segment in path.iter().rev() {
        text = match segment.strip_suffix("[]") {
            Some(name) => format!("{{{name}: [{text}]}}"),
            None => format!("{{{segment}: {text}}}"),
        };
    }
    text
}

/// The keys the parser names when `{__probe: 1}` is written at `path`, if it is a mapping.
fn children(path: &[String], list: bool) -> Option<Vec<String>> {
    let probe = format!("{{{PROBE}: 1}}");
    let value = if list { format!("[{probe}]") } else { probe };
    let text = nested(path, &value);
    let err = Config::from_yaml(&text, "probe", &Overrides::default()).err()?;
    let unknown = format!("unknown field `{PROBE}`");
    let issue = err.issues().iter().find(|i| i.message.contains(&unknown))?;
    let expected = issue.message.split_once("expected")?.1;
    Some(code_spans(expected))
}

/// Every key path the parser accepts: (leaves, mappings), dotted, `[]` after a list.
fn accepted_keys() -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut leaves, mut mappings) = (BTreeSet::new(), BTreeSet::new());
    let mut todo: Vec<Vec<String>> = vec![vec![]];
    while let Some(path) = todo.pop() {
        let under = |at: &[String], kids: Vec<String>| -> Vec<Vec<String>> {
            kids.into_iter()
                .map(|k| [at.to_vec(), vec![k]].concat())
                .collect()
        };
        if let Some(kids) = children(&path, false) {
            if !path.is_empty() {
                mappings.insert(path.join("."));
            }
            todo.extend(under(&path, kids));
        } else if let Some(kids) = children(&path, true) {
            mappings.insert(path.join("."));
            let mut list = path.clone();
            let last = list.pop().unwrap();
            list.push(format!("{last}[]"));
            todo.extend(under(&list, kids));
        } else {
            leaves.insert(path.join("."));
        }
    }
    (leaves, mappings)
}

/// `path` set to `value` in `doc` (a YAML mapping), creating the mappings on the way.
fn insert(doc: &mut serde_yaml::Value, path: &[&str], value: serde_yaml::Value) {
    let serde_yaml::Value::Mapping(map) = doc else {
        panic!("{path:?}: not a mapping");
    };
    let key = serde_yaml::Value::String(path[0].to_string());
    if path.len() == 1 {
        map.insert(key, value);
        return;
    }
    let next = map
        .entry(key)
        .or_insert_with(|| serde_yaml::Value::Mapping(Default::default()));
    insert(next, &path[1..], value);
}

/// The file a key's default is checked in: an upstream, and the OTLP push (and spans) on
/// for the keys that only count then.
fn base_for(key: &str) -> serde_yaml::Value {
    let mut doc = serde_yaml::Value::Mapping(Default::default());
    let url = serde_yaml::Value::String("http://127.0.0.1:9".to_string());
    insert(&mut doc, &["upstream", "url"], url);
    if key.starts_with("otlp.") && key != "otlp.enabled" {
        insert(&mut doc, &["otlp", "enabled"], true.into());
    }
    if key.starts_with("otlp.traces.") && key != "otlp.traces.enabled" {
        insert(&mut doc, &["otlp", "traces", "enabled"], true.into());
    }
    doc
}

fn load(doc: &serde_yaml::Value) -> Result<String, String> {
    let text = serde_yaml::to_string(doc).unwrap();
    Config::from_yaml(&text, "docs", &Overrides::default())
        .map(|config| format!("{config:?}"))
        .map_err(|e| format!("{e}\n{text}"))
}

#[test]
fn every_config_key_is_documented_with_its_default() {
    let doc = read("docs/CONFIGURATION.md");
    let rows = tables(&doc, "| key | default | meaning |");
    let mut documented = BTreeMap::new();
    for row in &rows {
        let key = literal(&row[0]).unwrap_or_else(|| panic!("a key in backticks: {row:?}"));
        assert!(
            documented.insert(key.to_string(), row[1].clone()).is_none(),
            "docs/CONFIGURATION.md: `{key}` has two rows"
        );
    }
    let (leaves, mappings) = accepted_keys();
    assert!(
        leaves.len() > 50,
        "the probe found too few keys: {leaves:?}"
    );
    let listed: BTreeSet<String> = documented.keys().cloned().collect();
    let missing: Vec<_> = leaves.difference(&listed).collect();
    assert!(
        missing.is_empty(),
        "keys the parser accepts that docs/CONFIGURATION.md does not list: {missing:?}"
    );
    let unknown: Vec<_> = documented
        .keys()
        .filter(|k| !leaves.contains(*k) && !mappings.contains(*k))
        .collect();
    assert!(
        unknown.is_empty(),
        "keys docs/CONFIGURATION.md lists that the parser does not accept: {unknown:?}"
    );

    let mut checked = 0;
    for (key, default) in &documented {
        let Some(value) = literal(default) else {
            continue;
        };
        let base = base_for(key);
        let left_out = load(&base).unwrap_or_else(|e| panic!("`{key}`: the base file: {e}"));
        let mut written = base.clone();
        let value: serde_yaml::Value = serde_yaml::from_str(value).unwrap();
        let path: Vec<&str> = key.split('.').collect();
        insert(&mut written, &path, value);
        let written = load(&written).unwrap_or_else(|e| {
            panic!("docs/CONFIGURATION.md: `{key}`'s default {default} is refused: {e}")
        });
        if written != left_out {
            let at = written
                .bytes()
                .zip(left_out.bytes())
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            let around = |s: &str| s[at.saturating_sub(60)..(at + 40).min(s.len())].to_string();
            panic!(
                "docs/CONFIGURATION.md: `{key}`'s default {default} is not what the code uses \
                 when the key is left out:\n  written:  ...{}...\n  left out: ...{}...",
                around(&written),
                around(&left_out)
            );
        }
        checked += 1;
    }
    assert!(checked > 40, "only {checked} defaults were literals");
}

// ---------------------------------------------------------------------------------------
// Flags and environment variables

/// What `tokentap [command] --help` lists: flag -> (env, default).
fn help(command: &[&str]) -> BTreeMap<String, (Option<String>, Option<String>)> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tokentap"))
        .args(command)
        .arg("--help")
        .env_clear()
        .output()
        .expect("run tokentap --help");
    let text = String::from_utf8(out.stdout).unwrap();
    let mut flags = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let flag = trimmed
            .strip_prefix("-h, ")
            .or_else(|| trimmed.strip_prefix("-V, "))
            .unwrap_or(trimmed);
        if let Some(rest) = flag.strip_prefix("--") {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            current = (name != "help" && name != "version").then_some(name.clone());
            if let Some(name) = &current {
                flags.insert(name.clone(), (None, None));
            }
        }
        if let Some(name) = &current {
            let entry = flags.get_mut(name).unwrap();
            if let Some((_, env)) = line.split_once("[env: ") {
                entry.0 = env.split('=').next().map(str::to_string);
            }
            if let Some((_, default)) = line.split_once("[default: ") {
                entry.1 = default.split(']').next().map(str::to_string);
            }
        }
    }
    flags
}

/// The `| flag | env | default | meaning |` table under the heading `### \`heading\``.
fn flag_table(doc: &str, heading: &str) -> Vec<Vec<String>> {
    let start = format!("### `{heading}`\n");
    let at = doc
        .find(&start)
        .unwrap_or_else(|| panic!("docs/CONFIGURATION.md has a heading {start}"));
    let section = &doc[at + start.len()..];
    let end = section.find("\n#").unwrap_or(section.len());
    tables(&section[..end], "| flag | env | default | meaning |")
}

#[test]
fn every_flag_and_environment_variable_is_documented() {
    let doc = read("docs/CONFIGURATION.md");
    for (heading, command) in [
        ("tokentap", &[][..]),
        ("tokentap sim", &["sim"][..]),
        ("tokentap demo", &["demo"][..]),
        ("tokentap top", &["top"][..]),
    ] {
        let accepted = help(command);
        let mut documented = BTreeMap::new();
        for row in flag_table(&doc, heading) {
            let spans = code_spans(&row[0]);
            let flag = spans
                .first()
                .and_then(|s| s.strip_prefix("--"))
                .and_then(|s| s.split_whitespace().next())
                .unwrap_or_else(|| panic!("{heading}: a `--flag` first: {row:?}"));
            documented.insert(flag.to_string(), row);
        }
        assert_eq!(
            documented.keys().collect::<BTreeSet<_>>(),
            accepted.keys().collect::<BTreeSet<_>>(),
            "docs/CONFIGURATION.md, `{heading}`: the documented flags (left) against what \
             `{heading} --help` accepts (right)"
        );
        for (flag, (env, default)) in &accepted {
            let row = &documented[flag];
            assert_eq!(
                literal(&row[1]),
                env.as_deref(),
                "docs/CONFIGURATION.md, `{heading} --{flag}`: its environment variable"
            );
            if let Some(default) = default {
                assert_eq!(
                    literal(&row[2]),
                    Some(default.as_str()),
                    "docs/CONFIGURATION.md, `{heading} --{flag}`: its default"
                );
            }
        }
    }

    // The OpenTelemetry and pod variables the `otlp` settings read.
    let code = read("src/config/otlp.rs");
    let read_by_code: BTreeSet<String> = code
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| s.starts_with("OTEL_") || s.starts_with("K8S_"))
        .filter(|s| s.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .map(str::to_string)
        .collect();
    let otel = read("docs/OPENTELEMETRY.md");
    let documented: BTreeSet<String> = otel
        .lines()
        .filter(|l| l.starts_with('|'))
        .flat_map(code_spans)
        .filter_map(|s| {
            let name: String = s
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || *c == '_')
                .collect();
            let known = name.starts_with("OTEL_") || name.starts_with("K8S_");
            (known && !name.ends_with('_')).then_some(name)
        })
        .collect();
    let unread: Vec<_> = documented.difference(&read_by_code).collect();
    let undocumented: Vec<_> = read_by_code.difference(&documented).collect();
    assert!(
        unread.is_empty() && undocumented.is_empty(),
        "docs/OPENTELEMETRY.md's tables name variables src/config/otlp.rs does not read: \
         {unread:?}; and miss variables it reads: {undocumented:?}"
    );
}

// ---------------------------------------------------------------------------------------
// Alerts

/// The recording rules an expression reads (`level:metric:operation` names).
fn recording_rules(expr: &str) -> BTreeSet<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|t| t.matches(':').count() == 2 && !t.starts_with(':'))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_alert_is_documented_with_its_thresholds() {
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&read("deploy/prometheus/rules.yaml")).expect("rules.yaml is YAML");
    let mut alerts = BTreeMap::new();
    let mut thresholds = BTreeMap::new();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let expr = rule["expr"].as_str().unwrap();
            if let Some(name) = rule["alert"].as_str() {
                alerts.insert(name.to_string(), rule.clone());
            }
            if let Some(record) = rule["record"].as_str() {
                if record.starts_with("tokentap:threshold:") {
                    let value = expr
                        .trim()
                        .strip_prefix("vector(")
                        .and_then(|v| v.strip_suffix(')'))
                        .unwrap_or_else(|| panic!("{record}: vector(N)"));
                    thresholds.insert(record.to_string(), value.parse::<f64>().unwrap());
                }
            }
        }
    }
    let doc = read("deploy/README.md");

    let documented: BTreeMap<String, f64> = tables(&doc, "| threshold | value | meaning |")
        .iter()
        .map(|row| {
            let name = literal(&row[0])
                .expect("a threshold in backticks")
                .to_string();
            (name, row[1].parse().expect("a threshold's value"))
        })
        .collect();
    assert_eq!(
        documented, thresholds,
        "deploy/README.md's thresholds (left) against rules.yaml's `tokentap.thresholds` (right)"
    );

    let rows = tables(&doc, "| alert | severity, `for` | fires when |");
    let rows: BTreeMap<String, &Vec<String>> = rows
        .iter()
        .map(|row| (literal(&row[0]).expect("an alert").to_string(), row))
        .collect();
    assert_eq!(
        rows.keys().collect::<Vec<_>>(),
        alerts.keys().collect::<Vec<_>>(),
        "deploy/README.md's alerts (left) against rules.yaml's (right)"
    );
    for (name, rule) in &alerts {
        let row = rows[name];
        let severity = rule["labels"]["severity"].as_str().unwrap();
        let expected = match rule["for"].as_str() {
            Some(wait) => format!("{severity}, {wait}"),
            None => severity.to_string(),
        };
        assert_eq!(
            row[1], expected,
            "deploy/README.md, `{name}`: severity and for"
        );
        let reads = recording_rules(rule["expr"].as_str().unwrap());
        let (want_thresholds, want_rules): (BTreeSet<_>, BTreeSet<_>) = reads
            .into_iter()
            .partition(|r| r.starts_with("tokentap:threshold:"));
        let named = |cell: &str| -> BTreeSet<String> {
            code_spans(cell)
                .into_iter()
                .filter(|s| s.matches(':').count() == 2)
                .collect()
        };
        assert_eq!(
            named(&row[3]),
            want_thresholds,
            "deploy/README.md, `{name}`: the thresholds it joins against"
        );
        assert_eq!(
            named(&row[4]),
            want_rules,
            "deploy/README.md, `{name}`: the recording rules it reads"
        );
    }
}

// ---------------------------------------------------------------------------------------
// README's two commands

#[test]
fn readme_keeps_its_two_commands() {
    let readme = read("README.md");
    for line in [
        "cargo run --release -- demo      # simulator + tokentap + traffic, live figures in the terminal",
        "bash scripts/test.sh             # the whole test suite (what CI runs)",
    ] {
        assert!(readme.contains(line), "README.md has lost `{line}`");
    }
    // CI runs exactly README's test command; `demo::demo_runs_and_shows_per_model_figures`
    // runs the other.
    assert!(read(".ci/run").contains("\nexec bash scripts/test.sh\n"));
}

// ---------------------------------------------------------------------------------------
// The instruction budget's counts in docs/PERFORMANCE.md

/// Each bench's count in `benches/budget.toml` (`[bench."NAME"]`, then `instructions = N`).
fn budget_counts() -> BTreeMap<String, i64> {
    let mut counts = BTreeMap::new();
    let mut bench = None;
    for line in read("benches/budget.toml").lines() {
        if let Some(name) = line
            .strip_prefix("[bench.\"")
            .and_then(|rest| rest.strip_suffix("\"]"))
        {
            bench = Some(name.to_string());
        } else if let (Some(name), Some(count)) =
            (bench.as_ref(), line.strip_prefix("instructions = "))
        {
            let count = count
                .trim()
                .parse()
                .expect("a whole number of instructions");
            counts.insert(name.clone(), count);
        }
    }
    counts
}

/// A count as the docs write it (`5,994`), or `None` for a cell without one.
fn count(cell: &str) -> Option<i64> {
    cell.replace(',', "").parse().ok()
}

#[test]
fn the_performance_docs_count_of_each_bench_is_the_budgets() {
    let budget = budget_counts();
    let rows = tables(&read("docs/PERFORMANCE.md"), "| bench | 3b010c7 |");
    assert!(
        !rows.is_empty(),
        "docs/PERFORMANCE.md has lost its table of bench counts"
    );
    for row in rows {
        let [bench, base, .., now, against] = row.as_slice() else {
            panic!("a short row: {row:?}");
        };
        let count_now = budget
            .get(bench)
            .unwrap_or_else(|| panic!("{bench}: not a bench of benches/budget.toml"));
        assert_eq!(
            count(now),
            Some(*count_now),
            "{bench}: the docs say {now} now, benches/budget.toml {count_now}"
        );
        let expected = count(base).map_or_else(String::new, |base| {
            let percent = format!("{:+.1}%", (*count_now as f64 / base as f64 - 1.0) * 100.0);
            if bench.ends_with("/event") {
                format!("{:+} ({percent})", count_now - base)
            } else {
                percent
            }
        });
        assert_eq!(against, &expected, "{bench} against 3b010c7");
    }
}

// ---------------------------------------------------------------------------------------
// Links

/// The Markdown files of the repository (not build output or vendored packages).
fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            if !["target", "node_modules", ".git", "corpus", "artifacts"].contains(&name.as_str()) {
                markdown_files(&path, out);
            }
        } else if name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// `text` without fenced code blocks and inline code spans.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            let plain: String = line
                .split('`')
                .enumerate()
                .filter(|(i, _)| i % 2 == 0)
                .map(|(_, s)| s)
                .collect::<Vec<_>>()
                .join("");
            out.push_str(&plain);
        }
        out.push('\n');
    }
    out
}

/// GitHub's anchors of the headings of a Markdown text.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim();
        let slug: String = title
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.entry(slug.clone()).or_default();
        out.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of the inline links and images of a Markdown text.
fn links(text: &str) -> Vec<String> {
    let text = prose(text);
    let mut out = Vec::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        if let Some(end) = rest.find(')') {
            out.push(rest[..end].trim().to_string());
        }
    }
    out
}

#[test]
fn every_relative_link_resolves() {
    let mut files = Vec::new();
    markdown_files(&root(), &mut files);
    assert!(files.len() >= 10, "{files:?}");
    let mut broken = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let name = file.strip_prefix(root()).unwrap().display().to_string();
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") || link.is_empty() {
                continue;
            }
            let (path, anchor) = match link.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (link.as_str(), None),
            };
            let target = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            if !target.exists() {
                broken.push(format!("{name}: {link}: no such file"));
                continue;
            }
            if let Some(anchor) = anchor {
                let is_md = target.extension().is_some_and(|e| e == "md");
                let heads = anchors(&std::fs::read_to_string(&target).unwrap_or_default());
                if !is_md || !heads.contains(anchor) {
                    broken.push(format!("{name}: {link}: no heading #{anchor}"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_anchor_rule_is_githubs() {
    let heads =
        anchors("# A `b` c\n## How a change's cost is judged\n## A\n## A\n```\n# not\n```\n");
    let want = ["a-b-c", "how-a-changes-cost-is-judged", "a", "a-1"];
    assert_eq!(heads, want.iter().map(|s| s.to_string()).collect());
    assert_eq!(
        links("[x](a.md#b) `[y](no)` ![i](img.png)\n```\n[z](no)\n```\n"),
        ["a.md#b", "img.png"]
    );
}
