//! Reading the tables of the docs, for the tests that hold the docs to the code: the rows
//! of every Markdown table whose header line starts a given way, and the `code` spans of a
//! cell. One reader, so that two pages' checks cannot read a table two ways.

/// The data rows of every table in `doc` whose header line starts with `header` (the
/// header and its `|---` line left out), in order.
pub(crate) fn rows<'a>(doc: &'a str, header: &str) -> Vec<&'a str> {
    let mut rows = Vec::new();
    let mut inside = false;
    for line in doc.lines() {
        if line.starts_with(header) {
            inside = true;
            continue;
        }
        if !line.starts_with('|') {
            inside = false;
        }
        if inside && !line.starts_with("|---") {
            rows.push(line);
        }
    }
    rows
}

/// The text of each `code` span in `text`, in order.
pub(crate) fn code_spans(text: &str) -> impl Iterator<Item = &str> {
    text.split('`').skip(1).step_by(2)
}
