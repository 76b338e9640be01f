//! `tokengate usage --admin URL [--csv]`: reads `GET /admin/quotas` and prints every tenant's
//! quotas, one row per window and unit: the limit in force, what is spent and held by requests
//! in flight, what remains and when the window resets. A table for people, or CSV with a header
//! row for a spreadsheet or a script (every field of the answer, amounts as it gives them).

use crate::admin_client::AdminArgs;
use serde::Deserialize;
use serde_json::Number;
use std::fmt::Write;

/// `tokengate usage`.
#[derive(Debug, Clone, clap::Args)]
pub struct UsageArgs {
    /// The gateway's admin listener, its token and the time for the fetch.
    #[command(flatten)]
    pub admin: AdminArgs,
    /// Print CSV with a header row instead of a table.
    #[arg(long)]
    pub csv: bool,
}

/// `GET /admin/quotas`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct QuotasView {
    /// The tenants in force with quotas, in config order.
    pub tenants: Vec<TenantQuotasView>,
}

/// One tenant's meters.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TenantQuotasView {
    /// The tenant.
    pub name: String,
    /// One per limit of each window, in config order.
    pub meters: Vec<MeterView>,
}

/// One meter: amounts in its unit, tokens or (for `cost`) the currency.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct MeterView {
    /// As configured: `calendar-day@Asia/Shanghai`, `1h`.
    pub window: String,
    /// The zone `resets_at` is given in.
    pub timezone: String,
    /// `prefill`, `decode`, `total`, `weighted` or `cost`.
    pub unit: String,
    /// The limit in force: the configured one and what is granted in the window.
    pub limit: Number,
    /// The limit as the config gives it.
    pub configured_limit: Number,
    /// Granted by an operator in the window.
    pub granted: Number,
    /// Spent in the window.
    pub spent: Number,
    /// Held by requests in flight.
    pub reserved: Number,
    /// What can still be reserved.
    pub remaining: Number,
    /// The currency of a `cost` meter.
    pub currency: Option<String>,
    /// When the window's spend next goes down, RFC 3339 in `timezone`.
    pub resets_at: String,
    /// Seconds to `resets_at`, rounded up.
    pub resets_in_seconds: u64,
}

/// Runs `tokengate usage`.
pub fn run_usage(args: UsageArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let view: QuotasView = rt.block_on(args.admin.get_json("/admin/quotas"))?;
    if args.csv {
        print!("{}", csv(&view));
    } else {
        print!("{}", table(&view));
    }
    Ok(())
}

/// `amount` with the meter's currency after it (tokens stand alone).
fn with_currency(m: &MeterView, amount: &Number) -> String {
    match &m.currency {
        Some(currency) => format!("{amount} {currency}"),
        None => amount.to_string(),
    }
}

/// The rows as a table, its columns as wide as their widest cell.
pub fn table(view: &QuotasView) -> String {
    let header = [
        "tenant",
        "window",
        "unit",
        "limit",
        "spent",
        "reserved",
        "remaining",
        "resets",
    ];
    let mut rows: Vec<[String; 8]> = Vec::new();
    for t in &view.tenants {
        for m in &t.meters {
            // A grant shows beside the limit it raised.
            let granted = match m.granted.as_f64() {
                Some(g) if g > 0.0 => format!(" ({} granted)", m.granted),
                _ => String::new(),
            };
            let wait = std::time::Duration::from_secs(m.resets_in_seconds);
            rows.push([
                t.name.clone(),
                m.window.clone(),
                m.unit.clone(),
                with_currency(m, &m.limit) + &granted,
                with_currency(m, &m.spent),
                with_currency(m, &m.reserved),
                with_currency(m, &m.remaining),
                format!("{} (in {})", m.resets_at, humantime::format_duration(wait)),
            ]);
        }
    }
    if rows.is_empty() {
        return "no tenant in force has quotas\n".to_string();
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            (rows.iter().map(|r| r[i].chars().count()))
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let padded: Vec<String> = (cells.iter().zip(&widths))
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", padded.join("  ").trim_end());
    };
    line(&header);
    for row in &rows {
        line(&row.each_ref().map(String::as_str));
    }
    out
}

/// The CSV columns, in order.
pub const CSV_HEADER: [&str; 13] = [
    "tenant",
    "window",
    "timezone",
    "unit",
    "currency",
    "limit",
    "configured_limit",
    "granted",
    "spent",
    "reserved",
    "remaining",
    "resets_at",
    "resets_in_seconds",
];

/// A CSV field (RFC 4180): quoted when it holds a comma, a quote or a line break.
fn field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

/// The rows as CSV with a header row, amounts as the gateway gave them (no currency in them:
/// it has a column).
pub fn csv(view: &QuotasView) -> String {
    let mut out = CSV_HEADER.join(",") + "\n";
    for t in &view.tenants {
        for m in &t.meters {
            let cells = [
                t.name.clone(),
                m.window.clone(),
                m.timezone.clone(),
                m.unit.clone(),
                m.currency.clone().unwrap_or_default(),
                m.limit.to_string(),
                m.configured_limit.to_string(),
                m.granted.to_string(),
                m.spent.to_string(),
                m.reserved.to_string(),
                m.remaining.to_string(),
                m.resets_at.clone(),
                m.resets_in_seconds.to_string(),
            ];
            let cells: Vec<String> = cells.iter().map(|c| field(c)).collect();
            out += &cells.join(",");
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> QuotasView {
        serde_json::from_value(serde_json::json!({"tenants": [
            {"name": "alice", "meters": [
                {"window": "calendar-day@Asia/Shanghai", "timezone": "Asia/Shanghai", "unit": "decode",
                 "limit": 2100, "configured_limit": 2000, "granted": 100, "spent": 450, "reserved": 200,
                 "remaining": 1450, "currency": null, "resets_at": "2026-12-02T00:00:00+08:00",
                 "resets_in_seconds": 600}
            ]},
            {"name": "team, \"b\"", "meters": [
                {"window": "calendar-month", "timezone": "UTC", "unit": "cost",
                 "limit": 1.5, "configured_limit": 1.5, "granted": 0.0, "spent": 0.000102,
                 "reserved": 0.0, "remaining": 1.499898, "currency": "USD",
                 "resets_at": "2027-01-01T00:00:00+00:00", "resets_in_seconds": 2621400}
            ]}
        ]}))
        .unwrap()
    }

    #[test]
    fn the_table_has_a_row_per_meter_with_grants_currencies_and_the_wait_to_the_reset() {
        assert_eq!(
            table(&view()),
            "\
tenant     window                      unit    limit               spent         reserved  remaining     resets
alice      calendar-day@Asia/Shanghai  decode  2100 (100 granted)  450           200       1450          2026-12-02T00:00:00+08:00 (in 10m)
team, \"b\"  calendar-month              cost    1.5 USD             0.000102 USD  0.0 USD   1.499898 USD  2027-01-01T00:00:00+00:00 (in 30days 8h 10m)
"
        );
        let none = QuotasView { tenants: vec![] };
        assert_eq!(table(&none), "no tenant in force has quotas\n");
    }

    #[test]
    fn the_csv_has_a_header_row_and_every_field_quoting_what_needs_it() {
        assert_eq!(
            csv(&view()),
            "\
tenant,window,timezone,unit,currency,limit,configured_limit,granted,spent,reserved,remaining,resets_at,resets_in_seconds
alice,calendar-day@Asia/Shanghai,Asia/Shanghai,decode,,2100,2000,100,450,200,1450,2026-12-02T00:00:00+08:00,600
\"team, \"\"b\"\"\",calendar-month,UTC,cost,USD,1.5,1.5,0.0,0.000102,0.0,1.499898,2027-01-01T00:00:00+00:00,2621400
"
        );
        assert_eq!(
            csv(&QuotasView { tenants: vec![] }),
            CSV_HEADER.join(",") + "\n"
        );
    }
}
