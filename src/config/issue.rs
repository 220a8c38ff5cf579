//! [`ConfigIssue`], one located configuration error: a leaf that the parser, the
//! validator and the error type all use, so none of them imports its importer.

use std::fmt;

/// One configuration error, located in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigIssue {
    /// Dotted key path, e.g. `upstream.url` (`.` for the document itself).
    pub path: String,
    /// 1-based line and column, when known.
    pub location: Option<(usize, usize)>,
    pub message: String,
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.location {
            Some((line, column)) => write!(f, "{line}:{column}: `{}`: {}", self.path, self.message),
            None => write!(f, "`{}`: {}", self.path, self.message),
        }
    }
}
