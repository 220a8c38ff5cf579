//! Where a key path is written in the YAML text, for issues found after deserializing
//! (serde locates only what it rejects itself; validation works on parsed values that no
//! longer know their line).

/// Find the line:column of a dotted key path in YAML text (block style), for issues found
/// after parsing. Numeric segments index block sequences (`- `); a key written on an
/// item's own line (`- path_prefix: /x`) is found there. Best effort: `None` when the key
/// is not written in the file (a default, a flag, or flow style like `{url: ...}`).
pub(super) fn locate(text: &str, path: &str) -> Option<(usize, usize)> {
    let nodes = yaml_nodes(text);
    let mut next = 0usize;
    let mut parent_indent: isize = -1;
    let mut parent_is_item = false;
    let mut found = None;
    for segment in path.split('.') {
        found = None;
        let index = segment.parse::<usize>().ok();
        // Direct children of the parent: the first node deeper than it sets the level.
        let mut child_indent = None;
        let mut seen = 0usize;
        while let Some(node) = nodes.get(next) {
            next += 1;
            let indent = node.indent as isize;
            // A sequence may sit at its parent key's own indent (`key:\n- item`).
            let item_of_parent = node.key.is_none() && indent == parent_indent && !parent_is_item;
            if indent <= parent_indent && !item_of_parent {
                return None;
            }
            let level = *child_indent.get_or_insert(node.indent);
            if node.indent != level {
                continue;
            }
            let hit = match (index, node.key) {
                (Some(index), None) => {
                    seen += 1;
                    seen == index + 1
                }
                (None, Some(key)) => key == segment,
                _ => false,
            };
            if hit {
                found = Some((node.line, node.indent + 1));
                parent_indent = indent;
                parent_is_item = node.key.is_none();
                break;
            }
        }
        found?;
    }
    found
}

/// One block-style YAML node start: a `key:` or a sequence item's `-`.
struct YamlNode<'t> {
    /// 1-based line.
    line: usize,
    /// 0-based column where the node starts.
    indent: usize,
    /// The key, or `None` for a sequence item.
    key: Option<&'t str>,
}

/// The nodes of `text` in order; `- key: v` is an item followed by a key on the same line.
fn yaml_nodes(text: &str) -> Vec<YamlNode<'_>> {
    let mut nodes = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut indent = indent_of(line);
        let mut rest = &line[indent..];
        if is_blank(rest) {
            continue;
        }
        while rest == "-" || rest.starts_with("- ") {
            nodes.push(YamlNode {
                line: n + 1,
                indent,
                key: None,
            });
            let after = rest[1..].trim_start_matches(' ');
            indent += rest.len() - after.len();
            rest = after;
        }
        if rest.is_empty() {
            continue;
        }
        // `key: value` or `key:` (a colon inside a value, as in a URL, is no key).
        let key = rest
            .find(':')
            .filter(|&colon| matches!(rest.as_bytes().get(colon + 1), None | Some(b' ')))
            .map(|colon| rest[..colon].trim().trim_matches(['"', '\'']));
        nodes.push(YamlNode {
            line: n + 1,
            indent,
            // A plain scalar line (a continuation, a flow item) is a node with a key no
            // segment matches.
            key: Some(key.unwrap_or("")),
        });
    }
    nodes
}

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

fn is_blank(trimmed: &str) -> bool {
    trimmed.is_empty() || trimmed.starts_with('#')
}
