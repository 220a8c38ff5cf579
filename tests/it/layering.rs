//! The crate's layering, checked from its source: one request can be followed
//! listener -> proxy -> observe -> wire -> clock -> metrics without a file that imports its
//! importer, and the sans-IO core (`clock`; `wire` is a crate of its own) imports none of
//! the layers above it.
//!
//! What a crate boundary keeps is not checked here: the compiler refuses it (issue 34).
//! `tokentap-wire` (crates/wire) cannot import the proxy, so "wire imports nothing above
//! the core" and every cycle through `wire` are gone from these rules; `tokentap-metrics`
//! (crates/metrics) cannot either, so "metrics takes plain values" (nothing in it refers
//! to `clock`, `observe`, `proxy` or `server`), "config depends on metrics, not the
//! reverse" and every cycle through `metrics` are gone too; `tokentap-sim` (crates/sim)
//! imports only `tokentap-wire`. What the compiler cannot keep stays: cargo has no
//! dependency of a binary alone, so that no library module uses the simulator or the
//! inject crate (only the `tokentap` command's `demo_cmd` and `inject_cmd`) is read from
//! the source, as are the module rules inside the proxy's crate, and what the proxy's own
//! modules may import of the metrics crate (the core may not: it is above the core), which
//! the proxy depends on. A path into it (`crate::metrics::..`, the re-export, or
//! `tokentap_metrics::..`) is an edge to a module `metrics` of no edges of its own.
//!
//! The check reads `src/` (not `src/bin/` or `main.rs`, which only use the library), and
//! for the first rule `crates/metrics/src/` too, and builds the graph of which module file
//! refers to which: `use` items, paths written in
//! code (`crate::x::y`, `super::y`) and, in a parent, paths into its own child modules
//! (`child::Item`, re-exports included). Comments, string literals and `#[cfg(test)]`
//! modules (inline, or a file declared `#[cfg(test)] mod x;`) are left out: a test may look
//! anywhere. An inline `mod x { .. }` is part of its file, so its `super::` points back into
//! that file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// The metrics crate's name in paths, and the module name the proxy re-exports it as.
const METRICS_CRATE: (&str, &str) = ("tokentap_metrics", "metrics");

/// Layers the sans-IO core must not reach into.
const ABOVE_THE_CORE: [&str; 10] = [
    "proxy", "observe", "metrics", "server", "config", "admin", "demo", "otlp", "live", "top",
];

/// Inside the proxy's crate, and inside the metrics crate (a crate boundary keeps what
/// crosses it, not the modules within: its files are read as the module `metrics`, as
/// they were when it was one).
#[test]
fn no_module_imports_its_importer() {
    let metrics = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/metrics/src");
    let mut mutual = Vec::new();
    for graph in [
        Graph::read(&src_dir()),
        Graph::read_crate(&metrics, METRICS_CRATE.1),
    ] {
        assert!(graph.edges.len() > 10, "is the module graph read at all?");
        for (from, targets) in &graph.edges {
            for to in targets {
                if from < to && graph.edges.get(to).is_some_and(|back| back.contains(from)) {
                    mutual.push(format!("{} <-> {}", name(from), name(to)));
                }
            }
        }
    }
    assert!(
        mutual.is_empty(),
        "modules that import each other:\n{}",
        mutual.join("\n")
    );
}

#[test]
fn the_sans_io_core_imports_no_layer_above_it() {
    let graph = Graph::read(&src_dir());
    let mut reached = Vec::new();
    for (from, targets) in &graph.edges {
        // `wire` is a crate the proxy depends on: it cannot name the proxy at all.
        if !matches!(from.first().map(String::as_str), Some("clock")) {
            continue;
        }
        for to in targets {
            if to
                .first()
                .is_some_and(|top| ABOVE_THE_CORE.contains(&top.as_str()))
            {
                reached.push(format!("{} -> {}", name(from), name(to)));
            }
        }
    }
    assert!(
        reached.is_empty(),
        "clock reaches up:\n{}",
        reached.join("\n")
    );
}

#[test]
fn the_relay_readers_are_sans_io() {
    // The relay's head and framing readers take bytes and plain rules, like the core.
    let graph = Graph::read(&src_dir());
    let readers = [
        "request_head",
        "chunked",
        "response",
        "response_relay",
        "serialize",
    ];
    for reader in readers {
        let module = vec!["relay".to_string(), reader.to_string()];
        assert!(
            graph.edges.contains_key(&module),
            "relay::{reader} not found"
        );
    }
    let mut reached = Vec::new();
    for (from, targets) in &graph.edges {
        let is_reader =
            from.len() == 2 && from[0] == "relay" && readers.contains(&from[1].as_str());
        if !is_reader {
            continue;
        }
        for to in targets {
            if to
                .first()
                .is_some_and(|top| ABOVE_THE_CORE.contains(&top.as_str()))
            {
                reached.push(format!("{} -> {}", name(from), name(to)));
            }
        }
    }
    assert!(
        reached.is_empty(),
        "relay readers reach up:\n{}",
        reached.join("\n")
    );
}

/// The relay's state machine, its serialisers and its readers, and the rules of the exchange
/// policy and of outcomes, read no socket and no clock: bytes and instants come in as
/// arguments. The outcome's vocabulary and verdict rules are the metrics crate's (no
/// tokio there to name, but `std::net` and the clocks are std's): they are read there.
#[test]
fn the_relay_machine_and_the_exchange_rules_do_no_io() {
    let files = [
        "src/relay/request_head.rs",
        "src/relay/chunked.rs",
        "src/relay/response.rs",
        "src/relay/response_relay.rs",
        "src/relay/serialize.rs",
        "src/exchange/fault.rs",
        "src/exchange/idle.rs",
        "src/exchange/answer.rs",
        "src/outcome/mod.rs",
        "src/outcome/answer.rs",
        "crates/metrics/src/outcome/mod.rs",
        "crates/metrics/src/outcome/verdict.rs",
        "src/intermediary.rs",
    ];
    let io = [
        "tokio::net",
        "std::net",
        "socket2",
        "libc::",
        "Instant::now",
        "SystemTime::now",
        "async ",
        ".await",
        "tokio::spawn",
    ];
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file))
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let code = code_only(&text);
        let code = code.split("#[cfg(test)]").next().unwrap_or_default();
        for needle in io {
            if code.contains(needle) {
                found.push(format!("{file}: {needle}"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "I/O or clock reads in sans-IO code:\n{}",
        found.join("\n")
    );
}

/// The two transports share the exchange policy, and nothing else: neither imports the
/// other, and the policy (and observation below it) imports neither.
#[test]
fn the_transports_meet_only_in_the_exchange_policy() {
    let graph = Graph::read(&src_dir());
    let forbidden = [
        ("relay", "proxy"),
        ("proxy", "relay"),
        ("exchange", "proxy"),
        ("exchange", "relay"),
        ("exchange", "server"),
        ("observe", "exchange"),
        ("observe", "proxy"),
        ("observe", "relay"),
        ("intermediary", "exchange"),
        ("intermediary", "proxy"),
        ("intermediary", "relay"),
    ];
    let mut found = Vec::new();
    for (from, targets) in &graph.edges {
        for to in targets {
            let pair = (
                from.first().map_or("", String::as_str),
                to.first().map_or("", String::as_str),
            );
            if forbidden.contains(&pair) {
                found.push(format!("{} -> {}", name(from), name(to)));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The crates that are for the `tokentap` command only, each with the command module
/// (a module of `main.rs`) that may use it: `tokentap inject`'s crate (the Kubernetes API
/// types) and the simulator (`tokentap sim`, `tokentap demo`). Cargo has no dependency
/// of one binary alone, so the library could name them; no library module does, so
/// nothing in the proxy's request path can depend on them, with or without `inject`.
#[test]
fn the_library_uses_neither_the_inject_crate_nor_the_simulator() {
    let src = src_dir();
    let mut files = BTreeMap::new();
    collect(&src, &src, &mut files);
    let mut users = Vec::new();
    for (krate, command) in [
        ("tokentap_inject", "inject_cmd"),
        ("tokentap_sim", "demo_cmd"),
    ] {
        let command: Module = vec![command.to_string()];
        assert!(
            files.contains_key(&command),
            "src/{}.rs moved: update this test",
            name(&command)
        );
        users.extend(
            files
                .iter()
                .filter(|(module, text)| **module != command && code_only(text).contains(krate))
                .map(|(module, _)| format!("{} uses {krate}", name(module))),
        );
    }
    assert!(users.is_empty(), "library modules: {users:?}");
}

/// The checker itself: a cycle written into a scratch tree is found, with comments,
/// strings, test modules and an inline module's `super::` ignored.
#[test]
fn the_checker_sees_a_cycle_and_ignores_what_is_not_code() {
    let dir = std::env::temp_dir().join(format!("tokentap-layering-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("a")).expect("scratch dir");
    let write = |path: &str, text: &str| std::fs::write(dir.join(path), text).expect("write");
    write("lib.rs", "pub mod a;\npub mod b;\n");
    write(
        "a/mod.rs",
        "mod leaf;\npub use leaf::Leaf;\n// crate::b::Nothing\nconst S: &str = \"super::b\";\n",
    );
    write(
        "a/leaf.rs",
        "pub struct Leaf;\nmod inner { use super::Leaf; }\n#[cfg(test)]\nmod tests { use crate::a::Leaf; }\n",
    );
    write(
        "b.rs",
        "use crate::a::Leaf;\nmod c;\nmod d;\n#[cfg(test)]\nmod t;\n",
    );
    std::fs::create_dir_all(dir.join("b")).expect("scratch dir");
    write(
        "b/c.rs",
        "use crate::a::Leaf;\nfn f() { crate::metrics::Metrics::new(); }\n",
    );
    write("b/d.rs", "use tokentap_metrics::Buckets;\n");
    write("b/t.rs", "use crate::b::c;\nuse crate::a::Leaf;\n");
    let graph = Graph::read(&dir);
    let module = |path: &str| -> Module { path.split("::").map(String::from).collect() };
    assert_eq!(
        graph.edges[&module("a")],
        BTreeSet::from([module("a::leaf")])
    );
    assert!(graph.edges[&module("a::leaf")].is_empty());
    assert_eq!(graph.edges[&module("b")], BTreeSet::from([module("a")]));
    // A file declared `#[cfg(test)] mod t;` is a test module: not in the graph.
    assert_eq!(
        graph.edges[&module("b::c")],
        BTreeSet::from([module("a"), module("metrics")])
    );
    // The metrics crate, by its name or the re-export: the module `metrics`.
    assert_eq!(
        graph.edges[&module("b::d")],
        BTreeSet::from([module("metrics")])
    );
    assert!(!graph.edges.contains_key(&module("b::t")));
    write("a/leaf.rs", "use crate::b;\npub struct Leaf;\n");
    write("b.rs", "use crate::a::leaf::Leaf;\n");
    let graph = Graph::read(&dir);
    assert!(graph.edges[&module("a::leaf")].contains(&module("b")));
    assert!(graph.edges[&module("b")].contains(&module("a::leaf")));
    let _ = std::fs::remove_dir_all(&dir);
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn name(module: &Module) -> String {
    if module.is_empty() {
        "crate".to_string()
    } else {
        module.join("::")
    }
}

struct Graph {
    /// Module file -> the module files it refers to (never itself).
    edges: BTreeMap<Module, BTreeSet<Module>>,
}

impl Graph {
    fn read(src: &Path) -> Graph {
        Graph::read_crate(src, "")
    }

    /// The graph of a crate whose `src` is `src`, its modules under `root` (none for the
    /// proxy's, the name it is re-exported as for another: `crate::x` is `root::x`).
    fn read_crate(src: &Path, root: &str) -> Graph {
        let root: Module = [root]
            .into_iter()
            .filter(|r| !r.is_empty())
            .map(String::from)
            .collect();
        let mut files = BTreeMap::new();
        collect(src, src, &mut files);
        let mut files: BTreeMap<Module, String> = files
            .into_iter()
            .map(|(module, text)| ([root.clone(), module].concat(), text))
            .collect();
        // Files declared `#[cfg(test)] mod x;` (and all under them) are test code.
        let tests: Vec<Module> = files
            .iter()
            .flat_map(|(module, text)| {
                test_children(&code_only(text)).into_iter().map(|child| {
                    let mut path = module.clone();
                    path.push(child);
                    path
                })
            })
            .collect();
        files.retain(|module, _| !tests.iter().any(|test| module.starts_with(test)));
        let mut modules: BTreeSet<Module> = files.keys().cloned().collect();
        // The metrics crate, re-exported as `crate::metrics`: a module of no edges (what it
        // imports, the compiler keeps), that the proxy's modules may or may not refer to.
        modules.insert(vec![METRICS_CRATE.1.to_string()]);
        let edges = files
            .iter()
            .map(|(module, text)| {
                let edges = references(module, text, &root, &modules);
                (module.clone(), edges)
            })
            .collect();
        Graph { edges }
    }
}

fn collect(root: &Path, dir: &Path, out: &mut BTreeMap<Module, String>) {
    let entries = std::fs::read_dir(dir).expect("src is readable");
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            if path != root.join("bin") {
                collect(root, &path, out);
            }
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") || path == root.join("main.rs") {
            continue;
        }
        let relative = path
            .strip_prefix(root)
            .expect("under src")
            .with_extension("");
        let mut module: Module = relative
            .iter()
            .map(|part| part.to_string_lossy().into_owned())
            .collect();
        if module
            .last()
            .is_some_and(|last| last == "mod" || last == "lib")
        {
            module.pop();
        }
        let text = std::fs::read_to_string(&path).expect("source is readable");
        out.insert(module, text);
    }
}

/// The module files `text` (the file of `module`) refers to.
fn references(
    module: &Module,
    text: &str,
    root: &Module,
    modules: &BTreeSet<Module>,
) -> BTreeSet<Module> {
    let code = code_only(text);
    let children: BTreeSet<String> = declared_children(&code);
    let mut found = BTreeSet::new();
    for (inline, line) in lines_outside_tests(&code) {
        // The module a `super::` in this line starts from: the file's, or an inline one's.
        let mut here = module.clone();
        here.extend(inline.iter().cloned());
        for path in paths(&line) {
            let absolute = match path.first().map(String::as_str) {
                Some("crate") => [root, &path[1..]].concat(),
                Some(krate) if krate == METRICS_CRATE.0 => vec![METRICS_CRATE.1.to_string()],
                Some("super") | Some("self") => {
                    let mut base = here.clone();
                    let mut rest = &path[..];
                    while rest.first().is_some_and(|s| s == "super") {
                        base.pop();
                        rest = &rest[1..];
                    }
                    if rest.first().is_some_and(|s| s == "self") {
                        rest = &rest[1..];
                    }
                    base.extend(rest.iter().cloned());
                    base
                }
                Some(first) if inline.is_empty() && children.contains(first) => {
                    let mut child = module.clone();
                    child.extend(path.iter().cloned());
                    child
                }
                _ => continue,
            };
            if let Some(target) = longest_module(&absolute, modules) {
                if &target != module {
                    found.insert(target);
                }
            }
        }
    }
    found
}

fn longest_module(path: &[String], modules: &BTreeSet<Module>) -> Option<Module> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|candidate| modules.contains(candidate))
}

/// `mod x;` declarations: the file's child modules.
fn declared_children(code: &str) -> BTreeSet<String> {
    let declaration =
        regex::Regex::new(r"(?m)^\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+([a-z_0-9]+)\s*;").expect("re");
    declaration
        .captures_iter(code)
        .map(|c| c[1].to_string())
        .collect()
}

/// `#[cfg(test)] mod x;` declarations: the file's child modules that are test code.
fn test_children(code: &str) -> BTreeSet<String> {
    let declaration = regex::Regex::new(
        r"(?m)^\s*#\[cfg\(test\)\]\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+([a-z_0-9]+)\s*;",
    )
    .expect("re");
    declaration
        .captures_iter(code)
        .map(|c| c[1].to_string())
        .collect()
}

/// Every path written in a line, with `use a::{b, c::d}` groups expanded one level per
/// brace; a path is its `::`-separated segments.
fn paths(line: &str) -> Vec<Vec<String>> {
    let path = regex::Regex::new(concat!(
        r"\b[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*::(?:\{|\*)",
        r"|\b[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)+",
    ))
    .expect("re");
    let mut out = Vec::new();
    for m in path.find_iter(line) {
        let text = m.as_str();
        let before = &line[..m.start()];
        if before.ends_with("::") {
            // The tail of a longer path already taken (`x::{a::b}` is expanded below).
            continue;
        }
        let prefix: Vec<String> = text
            .trim_end_matches("::{")
            .trim_end_matches("::*")
            .split("::")
            .map(String::from)
            .collect();
        if text.ends_with("::{") {
            let group = &line[m.end()..];
            for item in top_level_items(group) {
                let mut full = prefix.clone();
                full.extend(
                    item.split("::")
                        .map(|s| s.trim().to_string())
                        .take_while(|s| !s.is_empty() && !s.starts_with('{')),
                );
                out.push(full);
            }
        } else {
            out.push(prefix);
        }
    }
    out
}

/// The comma-separated items of a `{ .. }` group up to its closing brace.
fn top_level_items(group: &str) -> Vec<String> {
    let mut items = Vec::new();
    let mut depth = 0;
    let mut current = String::new();
    for c in group.chars() {
        match c {
            '{' => {
                depth += 1;
                current.push(c);
            }
            '}' if depth == 0 => break,
            '}' => {
                depth -= 1;
                current.push(c);
            }
            ',' if depth == 0 => items.push(std::mem::take(&mut current)),
            _ => current.push(c),
        }
    }
    items.push(current);
    items
        .into_iter()
        .map(|item| item.trim().split(" as ").next().unwrap_or("").to_string())
        .filter(|item| !item.is_empty() && item != "self" && item != "*")
        .collect()
}

/// The lines of `code` outside `#[cfg(test)]` modules, each with the stack of inline
/// modules it sits in. `use` items spread over several lines are joined into one.
fn lines_outside_tests(code: &str) -> Vec<(Vec<String>, String)> {
    let inline_mod =
        regex::Regex::new(r"^\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+([a-z_0-9]+)\s*\{").expect("re");
    let mut out = Vec::new();
    let mut depth: i64 = 0;
    // (name, depth inside it, is a test module)
    let mut stack: Vec<(String, i64, bool)> = Vec::new();
    let mut test_attribute = false;
    let mut pending = String::new();
    for raw in code.lines() {
        let line = raw.trim();
        let opens = raw.matches('{').count() as i64;
        let closes = raw.matches('}').count() as i64;
        let in_test = stack.iter().any(|(_, _, test)| *test);
        if let Some(m) = inline_mod.captures(raw) {
            stack.push((m[1].to_string(), depth + 1, test_attribute));
        } else if !in_test && !line.is_empty() {
            pending.push_str(line);
            pending.push(' ');
            let open_use = pending.trim_start().starts_with("use ")
                || pending.trim_start().starts_with("pub use ")
                || pending.trim_start().starts_with("pub(crate) use ");
            if !open_use || pending.contains(';') {
                let inline = stack.iter().map(|(name, _, _)| name.clone()).collect();
                out.push((inline, std::mem::take(&mut pending)));
            }
        }
        if !line.is_empty() && !line.starts_with("#[") {
            test_attribute = false;
        }
        if line.starts_with("#[cfg(test)]") {
            test_attribute = true;
        }
        depth += opens - closes;
        while stack.last().is_some_and(|(_, inside, _)| depth < *inside) {
            stack.pop();
        }
    }
    out
}

/// `text` with comments and string/char literals blanked (newlines kept, so lines stay).
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i += 2;
            while i < chars.len() && !(chars[i] == '*' && chars.get(i + 1) == Some(&'/')) {
                if chars[i] == '\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 2;
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&chars, i) {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                match chars.get(j) {
                    None => break,
                    Some('"') if (1..=hashes).all(|k| chars.get(j + k) == Some(&'#')) => {
                        j += 1 + hashes;
                        break;
                    }
                    Some('\n') => out.push('\n'),
                    _ => {}
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                } else if chars[i] == '\n' {
                    out.push('\n');
                }
                i += 1;
            }
            out.push_str("\"\"");
            i += 1;
        } else if c == '\'' && is_char_literal(&chars, i) {
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            out.push_str("' '");
            i += 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_before(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

/// A `'` that opens a char literal (`'a'`, `'\n'`, `'{'`), not a lifetime (`'a`).
fn is_char_literal(chars: &[char], i: usize) -> bool {
    match chars.get(i + 1) {
        Some('\\') => true,
        Some(_) => chars.get(i + 2) == Some(&'\''),
        None => false,
    }
}
