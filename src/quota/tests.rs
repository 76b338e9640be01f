use super::config::{tenant_quotas, PriceConfig, QuotaConfig};
use super::store::{LocalQuotaStore, QuotaStore, WriteErrors};
use super::*;
use crate::clock::ManualClock;
use std::collections::BTreeMap;

/// 2026-12-01T10:00:00Z.
const TEN_UTC: i64 = 1_796_119_200_000;

fn quotas_of(texts: &[&str]) -> (Quotas, Arc<TenantQuotas>, ManualClock) {
    quotas_in(Arc::new(LocalQuotaStore::in_memory()), texts)
}

/// [`quotas_of`] kept in `store`.
fn quotas_in(
    store: Arc<dyn QuotaStore>,
    texts: &[&str],
) -> (Quotas, Arc<TenantQuotas>, ManualClock) {
    let prices: BTreeMap<String, PriceConfig> =
        toml::from_str("[m]\ninput = 1.0\ncached_input = 0.1\noutput = 2.0\n").unwrap();
    let configs: Vec<QuotaConfig> = texts.iter().map(|t| toml::from_str(t).unwrap()).collect();
    let tenant = Arc::new(tenant_quotas("a", &configs, &prices).unwrap());
    let clock = ManualClock::at_wall(TEN_UTC);
    let prices = Prices::from_config(&prices, &["m".to_string()]).unwrap();
    let quotas = Quotas::new(store, Arc::new(clock.clone()), prices);
    (quotas, tenant, clock)
}

fn usage(prompt: u64, cached: u64, output: u64) -> Usage {
    Usage {
        prompt,
        cached,
        output,
    }
}

async fn spent(quotas: &Quotas, tenant: &TenantQuotas) -> Vec<(u64, u64)> {
    let readings = quotas.read("a", tenant).await.unwrap();
    readings.iter().map(|r| (r.spent, r.reserved)).collect()
}

#[tokio::test]
async fn a_hold_dropped_untold_gives_everything_back_and_one_told_keeps_what_was_used() {
    let (quotas, tenant, _) = quotas_of(&["window = \"calendar-day\"\ntotal = 1000\n"]);
    let hold = quotas
        .reserve("a", &tenant, "m", usage(100, 0, 200))
        .await
        .unwrap();
    assert_eq!(spent(&quotas, &tenant).await, [(0, 300)]);
    drop(hold);
    assert_eq!(spent(&quotas, &tenant).await, [(0, 0)]);
    let mut hold = quotas
        .reserve("a", &tenant, "m", usage(100, 0, 200))
        .await
        .unwrap();
    hold.used(usage(100, 40, 25));
    drop(hold);
    assert_eq!(spent(&quotas, &tenant).await, [(125, 0)]);
}

#[tokio::test]
async fn a_model_without_a_price_is_refused_where_a_cost_is_limited_and_not_elsewhere() {
    let (quotas, tenant, _) = quotas_of(&["window = \"calendar-day\"\ncost = 1.0\n"]);
    let e = quotas
        .reserve("a", &tenant, "other", usage(1, 0, 1))
        .await
        .unwrap_err();
    assert_eq!(e, QuotaError::Unpriced("other".into()));
    // A request naming no model is priced as the first served name.
    quotas
        .reserve("a", &tenant, "", usage(1, 0, 1))
        .await
        .unwrap();
    let (quotas, tenant, _) = quotas_of(&["window = \"calendar-day\"\ndecode = 10\n"]);
    quotas
        .reserve("a", &tenant, "other", usage(1, 0, 1))
        .await
        .unwrap();
}

#[tokio::test]
async fn the_ratelimit_fields_describe_the_tightest_window_in_its_unit() {
    let (quotas, tenant, clock) = quotas_of(&[
        "window = \"calendar-day\"\ncost = 2.5\n",
        "window = \"1h\"\ndecode = 1000\n",
    ]);
    // $1 per million prompt tokens, $2 per million output: 1,000,000 prompt tokens are $1.
    let hold = quotas
        .reserve("a", &tenant, "m", usage(1_000_000, 0, 100))
        .await
        .unwrap();
    let fields = RateLimitFields::tightest(hold.readings()).unwrap();
    // $2.5 - $1.0002 leaves 149 cents of 250 (0.6 of the day); 900 of 1000 decode is 0.9.
    assert_eq!(
        fields,
        RateLimitFields {
            policy: "\"cost-calendar-day\";q=250;w=86400;qu=\"USD-cents\"".into(),
            state: "\"cost-calendar-day\";r=149;t=50400".into(),
        }
    );
    let mut h = http::HeaderMap::new();
    fields.apply(&mut h);
    assert_eq!(h["ratelimit"], "\"cost-calendar-day\";r=149;t=50400");
    drop(hold);
    // The hour's tightest once it is the closer to spent; it resets when its oldest slice leaves.
    let mut hold = quotas
        .reserve("a", &tenant, "m", usage(0, 0, 950))
        .await
        .unwrap();
    hold.used(usage(0, 0, 950));
    drop(hold);
    clock.advance(std::time::Duration::from_secs(90));
    let readings = quotas.read("a", &tenant).await.unwrap();
    let fields = RateLimitFields::tightest(&readings).unwrap();
    assert_eq!(fields.state, "\"decode-1h\";r=50;t=3510");
}

#[tokio::test]
async fn a_grant_lets_a_refused_request_through_and_a_reset_forgets_the_window() {
    let (quotas, tenant, _) = quotas_of(&["window = \"calendar-month\"\ndecode = 100\n"]);
    let mut hold = quotas
        .reserve("a", &tenant, "m", usage(0, 0, 100))
        .await
        .unwrap();
    hold.used(usage(0, 0, 100));
    drop(hold);
    let refused = quotas
        .reserve("a", &tenant, "m", usage(0, 0, 10))
        .await
        .unwrap_err();
    let QuotaError::Refused(store::QuotaRefusal::Denied(denial)) = refused else {
        panic!("{refused:?}")
    };
    // The month ends at 2027-01-01T00:00Z: 30 days and 14 hours from now.
    assert_eq!(denial.retry_after.as_secs(), 30 * 86_400 + 14 * 3600);
    let meter = &tenant.meters[0];
    let reading = quotas.grant("a", meter, 10).await.unwrap();
    assert_eq!((reading.limit, reading.remaining()), (110, 10));
    quotas
        .reserve("a", &tenant, "m", usage(0, 0, 10))
        .await
        .unwrap();
    let reading = quotas.reset("a", meter).await.unwrap();
    assert_eq!((reading.spent, reading.limit), (0, 100));
}

/// Spends `prompt` tokens of tenant `a`'s quotas: a request that used them and nothing else.
async fn spend(quotas: &Quotas, tenant: &Arc<TenantQuotas>, prompt: u64) {
    let mut hold = quotas
        .reserve("a", tenant, "m", usage(prompt, 0, 0))
        .await
        .unwrap();
    hold.used(usage(prompt, 0, 0));
}

const TOTAL_DAY: &str = "window = \"calendar-day\"\ntotal = 1000\n";

/// The disk fills up after 18 tokens were written: the flushes of the 36 spent since fail
/// (each saying why, counted, the file shown unwritable), requests go on (the default policy),
/// and once the disk has room again the next flush writes all 54, which a restart reads back.
/// Before, the database refused every transaction after the first I/O error: a restart went
/// back to 18.
#[tokio::test]
async fn spend_a_full_disk_refused_is_written_once_the_disk_has_room() {
    let folder = super::persist::testing::Folder::new("quota-full-disk");
    let path = folder.0.join("quotas.redb");
    let disk = super::persist::testing::FullDisk::default();
    let errors = WriteErrors::default();
    let metrics = errors.metrics.clone();
    metrics.writable.set(1);
    let store = LocalQuotaStore::persisted_on(&path, Box::new(disk.clone()), errors).unwrap();
    let (quotas, tenant, _) = quotas_in(Arc::new(store), &[TOTAL_DAY]);
    spend(&quotas, &tenant, 18).await;
    quotas.flush().await.unwrap();
    disk.fill(true);
    spend(&quotas, &tenant, 18).await;
    for _ in 0..2 {
        let e = format!("{:#}", quotas.flush().await.unwrap_err());
        assert!(e.contains("No space left on device"), "{e}");
        assert_eq!(metrics.writable.get(), 0);
    }
    spend(&quotas, &tenant, 18).await;
    assert_eq!(metrics.write_errors.get(), 2);
    disk.fill(false);
    quotas.flush().await.unwrap();
    assert_eq!(metrics.writable.get(), 1);
    drop(quotas);
    let store = LocalQuotaStore::persisted(&path, WriteErrors::default()).unwrap();
    let (quotas, tenant, _) = quotas_in(Arc::new(store), &[TOTAL_DAY]);
    assert_eq!(spent(&quotas, &tenant).await, [(54, 0)]);
}

/// With `quotas.on_write_error = "refuse"`, a file that cannot be written refuses the
/// tenant's next request (503 `limiter_unavailable`, nothing reserved) until a write goes
/// through.
#[tokio::test]
async fn the_refuse_policy_refuses_requests_while_the_file_cannot_be_written() {
    let folder = super::persist::testing::Folder::new("quota-refuse");
    let path = folder.0.join("quotas.redb");
    let disk = super::persist::testing::FullDisk::default();
    let errors = WriteErrors {
        policy: super::config::OnWriteError::Refuse,
        ..WriteErrors::default()
    };
    let store = LocalQuotaStore::persisted_on(&path, Box::new(disk.clone()), errors).unwrap();
    let (quotas, tenant, _) = quotas_in(Arc::new(store), &[TOTAL_DAY]);
    disk.fill(true);
    spend(&quotas, &tenant, 18).await;
    assert!(quotas.flush().await.is_err());
    let refused = quotas
        .reserve("a", &tenant, "m", usage(1, 0, 0))
        .await
        .unwrap_err();
    let e = crate::error::ApiError::quota("a", refused);
    assert_eq!(
        (e.status.as_u16(), e.message.as_str()),
        (503, "the quota store cannot be reached (its file cannot be written: quotas.on_write_error = \"refuse\" refuses requests until a write goes through); nothing was charged")
    );
    assert_eq!(spent(&quotas, &tenant).await, [(18, 0)]);
    disk.fill(false);
    quotas.flush().await.unwrap();
    spend(&quotas, &tenant, 1).await;
    assert_eq!(spent(&quotas, &tenant).await, [(19, 0)]);
}
