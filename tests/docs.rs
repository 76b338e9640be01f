//! The README's tables held against the code they describe.

use std::path::Path;
use tokengate::error::ErrorCode;

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md")
}

/// The rows of the table whose header line is `header`, as cells.
fn table(text: &str, header: &str) -> Vec<Vec<String>> {
    let mut lines = text.lines().skip_while(|l| l.trim() != header);
    assert!(lines.next().is_some(), "no table headed {header:?}");
    lines
        .skip(1) // the |---| line
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

/// The `code` words of a cell, leaving out what stands in parentheses (`(param ...)`).
fn codes_in(cell: &str) -> Vec<String> {
    let bare = match cell.find('(') {
        Some(at) => &cell[..at],
        None => cell,
    };
    bare.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[test]
fn the_error_table_lists_every_code_with_its_status_in_order() {
    let text = readme();
    let mut documented: Vec<(String, String)> = Vec::new();
    for row in table(&text, "| status | code | when |") {
        for code in codes_in(&row[1]) {
            let entry = (row[0].clone(), code);
            if !documented.contains(&entry) {
                documented.push(entry);
            }
        }
    }
    let answered: Vec<(String, String)> = ErrorCode::ALL
        .iter()
        .map(|c| {
            let status = c
                .status()
                .map_or("4xx".to_string(), |s| s.as_u16().to_string());
            (status, c.as_str().to_string())
        })
        .collect();
    assert_eq!(documented, answered);
}

#[test]
fn codes_in_reads_the_code_column() {
    assert_eq!(
        codes_in("`model_not_found` / `not_found`"),
        ["model_not_found", "not_found"]
    );
    assert_eq!(
        codes_in("`invalid_request` (`param` `x-tokengate-priority`)"),
        ["invalid_request"]
    );
}

#[test]
fn the_endpoint_list_names_every_route_of_the_main_listener_and_no_other() {
    let text = readme();
    let main = text
        .lines()
        .skip_while(|l| !l.starts_with("Main listener:"))
        .take_while(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    assert!(!main.is_empty(), "no \"Main listener:\" paragraph");
    let documented: std::collections::BTreeSet<String> = main
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| w.starts_with("GET /") || w.starts_with("POST /"))
        .map(str::to_string)
        .collect();
    let served: std::collections::BTreeSet<String> = tokengate::server::path::main_routes()
        .map(|(path, method, _)| format!("{} {path}", method.as_str()))
        .collect();
    assert_eq!(documented, served);
}
