//! docs/reference.md held against the code it describes: the error table, the endpoint lists
//! of both listeners, the command list and the metric list.

use std::collections::BTreeSet;
use std::path::Path;
use tokengate::error::ErrorCode;

fn reference() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/reference.md"))
        .expect("docs/reference.md")
}

/// The text of the section headed `heading`, up to the next heading of any level.
fn section<'t>(text: &'t str, heading: &str) -> &'t str {
    let start = text
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no section {heading:?}"));
    let body = &text[start + heading.len() + 2..];
    let end = body.find("\n#").unwrap_or(body.len());
    &body[..end]
}

/// The words of `text` written as code (between backticks).
fn code_words(text: &str) -> impl Iterator<Item = &str> {
    text.split('`').skip(1).step_by(2)
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
    let text = reference();
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

/// The routes (`GET /path`, `POST /path`) the paragraph of the reference starting `opening`
/// names, up to its blank line.
fn listed_routes(text: &str, opening: &str) -> BTreeSet<String> {
    let paragraph = text
        .lines()
        .skip_while(|l| !l.starts_with(opening))
        .take_while(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    assert!(!paragraph.is_empty(), "no {opening:?} paragraph");
    code_words(&paragraph)
        .filter(|w| w.starts_with("GET /") || w.starts_with("POST /"))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_endpoint_list_names_every_route_of_the_main_listener_and_no_other() {
    let served: BTreeSet<String> = tokengate::server::path::main_routes()
        .map(|(path, method, _)| format!("{} {path}", method.as_str()))
        .collect();
    assert_eq!(listed_routes(&reference(), "Main listener:"), served);
}

#[test]
fn the_admin_endpoint_list_names_every_route_of_the_admin_listener_and_no_other() {
    let served: BTreeSet<String> = (tokengate::admin::ADMIN_ROUTES.iter())
        .map(|(path, method, _)| format!("{} {path}", method.as_str()))
        .collect();
    assert_eq!(
        listed_routes(&reference(), "Admin listener (keep it private):"),
        served
    );
}

#[test]
fn the_command_list_names_every_subcommand_and_no_other() {
    use clap::CommandFactory;
    let text = reference();
    let block = section(&text, "## Commands")
        .split("```")
        .nth(1)
        .expect("a code block of commands");
    // A command is `tokengate` and the lowercase words after it, up to its first argument.
    let documented: BTreeSet<String> = block
        .lines()
        .filter_map(|l| l.strip_prefix("tokengate "))
        .map(|rest| {
            (rest.split(' '))
                .take_while(|w| {
                    !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase() || b == b'-')
                })
                .take_while(|w| !w.starts_with('-'))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let cli = tokengate::cli::Cli::command();
    let served: BTreeSet<String> = cli
        .get_subcommands()
        .flat_map(|c| {
            let nested: Vec<String> = (c.get_subcommands())
                .map(|n| format!("{} {}", c.get_name(), n.get_name()))
                .collect();
            if nested.is_empty() {
                vec![c.get_name().to_string()]
            } else {
                nested
            }
        })
        .collect();
    assert_eq!(documented, served);
}

/// The metric families a name in the metric list stands for: `_total` left out (the exposition
/// names a counter's family without it), `tokengate_x_{a,b}_total` standing for both.
fn families(name: &str) -> Vec<String> {
    let family = |n: &str| n.strip_suffix("_total").unwrap_or(n).to_string();
    match (name.find("_{"), name.find('}')) {
        (Some(open), Some(close)) if name[open..close].contains(',') => name[open + 2..close]
            .split(',')
            .map(|part| family(&format!("{}_{part}{}", &name[..open], &name[close + 1..])))
            .collect(),
        _ => vec![family(name.split('{').next().unwrap_or(name))],
    }
}

#[test]
fn families_reads_the_metric_list() {
    assert_eq!(
        families("tokengate_tokenize_cache_{hits,misses}_total"),
        [
            "tokengate_tokenize_cache_hits",
            "tokengate_tokenize_cache_misses"
        ]
    );
    assert_eq!(
        families("tokengate_requests_total{tenant,outcome}"),
        ["tokengate_requests"]
    );
    assert_eq!(
        families("tokengate_kv_capacity_scale{backend}"),
        ["tokengate_kv_capacity_scale"]
    );
}

#[test]
fn the_metric_list_names_every_exported_family_and_no_other() {
    let text = reference();
    let documented: BTreeSet<String> = code_words(section(&text, "## Metrics"))
        .filter(|w| w.starts_with("tokengate_"))
        .flat_map(families)
        .collect();
    let exported: BTreeSet<String> = tokengate::metrics::Metrics::new()
        .encode()
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_string)
        .collect();
    assert_eq!(documented, exported);
}

/// GitHub's anchor of a heading: lowercase, spaces as `-`, punctuation but `-` and `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn anchor_is_githubs() {
    assert_eq!(anchor("MindIE's native API"), "mindies-native-api");
    assert_eq!(
        anchor("Benchmark: chat next to 16K-32K-token documents on one 910B3"),
        "benchmark-chat-next-to-16k-32k-token-documents-on-one-910b3"
    );
}

/// The targets of a Markdown text's links, `[text](target)`.
fn link_targets(text: &str) -> Vec<&str> {
    text.match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &text[at + 2..];
            rest.find(')').map(|end| &rest[..end])
        })
        .collect()
}

#[test]
fn every_link_of_the_readme_and_docs_reaches_a_file_and_heading_of_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = vec![root.join("README.md")];
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    let headings = |path: &Path| -> BTreeSet<String> {
        let text = std::fs::read_to_string(path).unwrap();
        let mut in_code = false;
        (text.lines())
            .filter(|l| {
                in_code ^= l.starts_with("```");
                !in_code && l.starts_with('#')
            })
            .map(|l| anchor(l.trim_start_matches('#')))
            .collect()
    };
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, fragment) = target.split_once('#').unwrap_or((target, ""));
            let file = match file {
                "" => page.clone(),
                f => page.parent().unwrap().join(f),
            };
            let reached = file.exists()
                && (fragment.is_empty()
                    || file.extension().is_some_and(|e| e != "md")
                    || headings(&file).contains(fragment));
            if !reached {
                broken.push(format!(
                    "{}: {target}",
                    page.strip_prefix(root).unwrap().display()
                ));
            }
        }
    }
    assert_eq!(broken, Vec::<String>::new());
}
