//! The CSV cell writer: every text comes back whole from an RFC 4180
//! reader, a cell never starts a spreadsheet formula, and a cell never
//! breaks out of its row.
#![no_main]

use gpuslice::domain::usage::csv_text;
use libfuzzer_sys::fuzz_target;

/// Reads one RFC 4180 cell back (quoted or bare).
fn read_back(cell: &str) -> String {
    match cell.strip_prefix('"').and_then(|c| c.strip_suffix('"')) {
        Some(inner) => {
            assert!(
                !inner.replace("\"\"", "").contains('"'),
                "a lone quote inside a quoted cell: {cell:?}"
            );
            inner.replace("\"\"", "\"")
        }
        None => {
            assert!(
                !cell.contains([',', '"', '\r', '\n']),
                "a bare cell with a separator: {cell:?}"
            );
            cell.to_string()
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let cell = csv_text(text);
    let back = read_back(&cell);
    // The text, or the text behind the formula guard.
    assert!(back == text || back == format!("'{text}"), "{text:?} -> {cell:?}");
    assert!(!back.starts_with(['=', '+', '-', '@', '\t', '\r']), "{cell:?}");
});
