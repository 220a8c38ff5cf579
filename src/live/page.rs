//! The page at `/ui` and the files it loads, compiled into the binary: it works on a
//! cluster with no way out. The charts are uPlot 1.6.32 (MIT, `assets/uplot.LICENSE`),
//! vendored whole as its release ships it (`assets/uplot.min.js`, `assets/uplot.min.css`);
//! the page's own script draws the heatmaps with uPlot's draw hooks.

/// `(path, content type, body)` of every file the page serves.
pub const FILES: [(&str, &str, &[u8]); 4] = [
    (
        "/ui",
        "text/html; charset=utf-8",
        include_bytes!("assets/index.html"),
    ),
    (
        "/ui/live.js",
        "text/javascript; charset=utf-8",
        include_bytes!("assets/live.js"),
    ),
    (
        "/ui/uplot.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("assets/uplot.min.js"),
    ),
    (
        "/ui/uplot.min.css",
        "text/css; charset=utf-8",
        include_bytes!("assets/uplot.min.css"),
    ),
];

/// The file served at `path`, if any: `(content type, body)`. The page is also the
/// listener's root, where a port-forwarded browser lands.
pub fn file(path: &str) -> Option<(&'static str, &'static [u8])> {
    let path = if matches!(path, "/" | "/ui/") {
        "/ui"
    } else {
        path
    };
    FILES
        .iter()
        .find(|(p, _, _)| *p == path)
        .map(|(_, content_type, body)| (*content_type, *body))
}
