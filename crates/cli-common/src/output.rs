//! Output for people (aligned tables, readable durations) and for scripts (one JSON document).

/// Prints rows as a table with a header, columns padded to their widest cell.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// Prints `key value` pairs, keys aligned.
pub fn print_fields(fields: &[(&str, String)]) {
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (key, value) in fields {
        println!("{key:<width$}  {value}");
    }
}

/// A duration in milliseconds, for people: `850ms`, `9.5s`, `2m30s`.
pub fn millis(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{:.1}s", ms as f64 / 1_000.0),
        _ => format!("{}m{:02}s", ms / 60_000, (ms % 60_000) / 1_000),
    }
}

/// How long ago, for people, to the second: `42s`, `3m12s`, `2h05m`, `3d04h`.
pub fn age(ms: u64) -> String {
    let s = ms / 1_000;
    match s {
        0..=59 => format!("{s}s"),
        60..=3_599 => format!("{}m{:02}s", s / 60, s % 60),
        3_600..=86_399 => format!("{}h{:02}m", s / 3_600, (s % 3_600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3_600),
    }
}

/// Set once a command printed its JSON document: an error after it is not printed as a second
/// one (stdout stays one document).
pub static PRINTED_JSON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub fn print_json(value: &serde_json::Value) {
    PRINTED_JSON.store(true, std::sync::atomic::Ordering::Relaxed);
    println!(
        "{}",
        serde_json::to_string_pretty(value).expect("JSON values serialize")
    );
}

/// [`print_json`] on one line: the last line of a command's output that follows other output
/// (`lock run`'s, after the command's own).
pub fn print_json_line(value: &serde_json::Value) {
    PRINTED_JSON.store(true, std::sync::atomic::Ordering::Relaxed);
    println!("{value}");
}

#[cfg(test)]
mod tests {
    #[test]
    fn durations_read_well() {
        assert_eq!(super::millis(850), "850ms");
        assert_eq!(super::millis(9_500), "9.5s");
        assert_eq!(super::millis(150_000), "2m30s");
    }
}
