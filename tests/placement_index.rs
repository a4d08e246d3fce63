//! The placement index (issue 18): the fleet in memory must always equal
//! the fleet read from the database, whatever changed it and in whatever
//! order transactions commit, and a transaction's own uncommitted changes
//! must never stay in it.

mod common;

use common::{book, book_from, member, SimNode, TestApp};
use gpuslice::booking::index::{self, SyncStats};
use gpuslice::domain::booking::Kind;
use sqlx::Acquire;

const FLEET: &str = r#"
[[node]]
name = "n1"
[[node.gpu]]
model = "H100-80GB"
mode = "mig"
count = 2
[[node.gpu]]
model = "L40S-48GB"
mode = "timeslice"
count = 2
max_shares = 4
"#;

async fn world() -> (TestApp, gpuslice::booking::Requester) {
    let app = TestApp::spawn().await;
    SimNode::register(&app, FLEET, "n1", 4).await;
    app.tenant("lab").await;
    sqlx::query(
        "UPDATE tenants SET max_active_bookings = 100, max_gpu_memory_gib = 10000, max_compute_slices = 1000, monthly_slice_hours = 1000000",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    app.user("ana@uni.edu", "none", &["lab"]).await;
    let who = member(&app, "ana@uni.edu", "lab").await;
    (app, who)
}

/// The index's view equals the database's, for `kind`, from a fresh
/// connection; returns how the synchronisation went.
async fn check(app: &TestApp, kind: Kind, what: &str) -> SyncStats {
    let idx = index::for_pool(&app.pool);
    let mut conn = app.pool.acquire().await.unwrap();
    let (snap, stats) = idx.snapshot_with_stats(&mut conn, kind).await.unwrap();
    let direct = index::read_direct(&mut conn, kind).await.unwrap();
    assert_eq!(snap, direct, "{what}: the index differs from the database");
    stats
}

async fn set_status(db: impl sqlx::PgExecutor<'_>, id: i64, status: &str) {
    let n = sqlx::query("UPDATE bookings SET status = $2 WHERE id = $1")
        .bind(id)
        .bind(status)
        .execute(db)
        .await
        .unwrap()
        .rows_affected();
    assert_eq!(n, 1);
}

#[tokio::test]
async fn index_equals_the_database_after_every_kind_of_change() {
    let (app, who) = world().await;
    let first = check(&app, Kind::Mig, "empty fleet").await;
    assert!(first.full_reload, "the first look loads in full");
    let again = check(&app, Kind::Mig, "nothing changed").await;
    assert!(
        !again.full_reload && again.reread == 0,
        "with no booking changed, no booking is read again: {again:?}"
    );

    // Bookings placed through the booking rules (which use the index).
    let mut ids = Vec::new();
    for profile in ["1g.10gb", "2g.20gb", "3g.40gb", "1g.10gb", "4g.40gb"] {
        let b = book(&app, &who, "mig", profile, 2).await;
        assert_eq!(b.status.as_str(), "scheduled", "{profile} is placed");
        ids.push(b.id);
    }
    // Each decision brought the index up to date before placing; the look
    // after them reads the last booking (committed after its own decision's
    // look) and, at most, the others again (the horizon is cluster-wide:
    // other tests' open transactions may hold it back).
    let s = check(&app, Kind::Mig, "five bookings placed").await;
    assert!(
        !s.full_reload && (1..=5).contains(&s.reread),
        "only what changed since the last decision is read: {s:?}"
    );
    assert_eq!(
        index::for_pool(&app.pool)
            .snapshot(&mut app.pool.acquire().await.unwrap(), Kind::Mig)
            .await
            .unwrap()
            .placed
            .len(),
        5
    );

    // Cancelled, moved in time, failed: each leaves or changes the index.
    set_status(&app.pool, ids[0], "cancelled").await;
    check(&app, Kind::Mig, "a booking cancelled").await;
    sqlx::query("UPDATE bookings SET during = tstzrange(lower(during), upper(during) + interval '1 hour') WHERE id = $1")
        .bind(ids[1])
        .execute(&app.pool)
        .await
        .unwrap();
    check(&app, Kind::Mig, "a booking extended").await;

    // The fleet: a GPU drained, then back; a foreign instance appears.
    sqlx::query(
        "UPDATE gpus SET mode = 'drained' WHERE id = (SELECT min(id) FROM gpus WHERE mode = 'mig')",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let s = check(&app, Kind::Mig, "a GPU drained").await;
    assert!(!s.full_reload);
    sqlx::query("UPDATE gpus SET mode = 'mig' WHERE mode = 'drained'")
        .execute(&app.pool)
        .await
        .unwrap();
    check(&app, Kind::Mig, "the GPU back").await;
    sqlx::query(
        "INSERT INTO foreign_instances (gpu_id, gi_id, profile, slice_start, slice_size)
         SELECT max(id), 9, '1g.10gb', 7, 1 FROM gpus WHERE mode = 'mig'",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    check(&app, Kind::Mig, "a foreign instance").await;

    // Metering and other columns that do not matter log nothing.
    let before: i64 = app.one("SELECT count(*) FROM placement_changes").await;
    sqlx::query("UPDATE bookings SET metered_until = now(), updated_at = now()")
        .execute(&app.pool)
        .await
        .unwrap();
    sqlx::query("UPDATE gpus SET last_seen = now()")
        .execute(&app.pool)
        .await
        .unwrap();
    let after: i64 = app.one("SELECT count(*) FROM placement_changes").await;
    assert_eq!(before, after, "no change of placement, nothing logged");

    // Shares: the other kind keeps its own part.
    check(&app, Kind::Timeslice, "no shares").await;
    let s1 = book(&app, &who, "timeslice", "", 2).await;
    let s2 = book(&app, &who, "timeslice", "", 2).await;
    check(&app, Kind::Timeslice, "two shares").await;
    set_status(&app.pool, s1.id, "released").await;
    check(&app, Kind::Timeslice, "a share released").await;
    set_status(&app.pool, s2.id, "failed").await;
    check(&app, Kind::Timeslice, "a share failed").await;
    check(&app, Kind::Mig, "MIG after the shares").await;
}

#[tokio::test]
async fn a_change_that_commits_late_is_not_skipped() {
    let (app, who) = world().await;
    let x = book(&app, &who, "mig", "1g.10gb", 2).await.id;
    let y = book(&app, &who, "mig", "1g.10gb", 2).await.id;
    check(&app, Kind::Mig, "two bookings").await;

    // A starts first (its transaction id is older) and commits last.
    let mut a = app.pool.begin().await.unwrap();
    set_status(&mut *a, x, "cancelled").await;
    let mut b = app.pool.begin().await.unwrap();
    set_status(&mut *b, y, "cancelled").await;
    b.commit().await.unwrap();
    check(&app, Kind::Mig, "B committed, A still open").await;
    a.commit().await.unwrap();
    check(&app, Kind::Mig, "A committed after a look that saw B").await;
    let snap = index::for_pool(&app.pool)
        .snapshot(&mut app.pool.acquire().await.unwrap(), Kind::Mig)
        .await
        .unwrap();
    assert!(
        snap.placed.is_empty(),
        "both cancellations are in the index"
    );
}

#[tokio::test]
async fn own_uncommitted_changes_are_seen_but_never_kept() {
    let (app, who) = world().await;
    let x = book(&app, &who, "mig", "1g.10gb", 2).await.id;
    check(&app, Kind::Mig, "one booking").await;
    let idx = index::for_pool(&app.pool);

    // Incremental look inside a transaction that cancelled x itself.
    let mut conn = app.pool.acquire().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    set_status(&mut *tx, x, "cancelled").await;
    let inside = idx.snapshot(&mut tx, Kind::Mig).await.unwrap();
    assert!(
        inside.placed.iter().all(|p| p.id != x),
        "the transaction sees its own cancellation"
    );
    assert_eq!(
        inside,
        index::read_direct(&mut tx, Kind::Mig).await.unwrap()
    );
    tx.rollback().await.unwrap();
    drop(conn);
    check(&app, Kind::Mig, "after the rollback").await;
    let after = idx
        .snapshot(&mut app.pool.acquire().await.unwrap(), Kind::Mig)
        .await
        .unwrap();
    assert!(
        after.placed.iter().any(|p| p.id == x),
        "the rolled-back cancellation did not stay in the index"
    );

    // The same with a GPU drained inside the transaction.
    let mut tx = app.pool.begin().await.unwrap();
    sqlx::query("UPDATE gpus SET mode = 'drained'")
        .execute(&mut *tx)
        .await
        .unwrap();
    let inside = idx.snapshot(&mut tx, Kind::Mig).await.unwrap();
    assert!(
        inside.gpus.is_empty(),
        "the transaction sees its drained GPUs"
    );
    tx.rollback().await.unwrap();
    check(&app, Kind::Mig, "after the drain rolled back").await;
}

#[tokio::test]
async fn placement_through_the_index_packs_and_never_overlaps() {
    // Twenty concurrent 1g.10gb requests on two H100s (14 slots): the
    // index under the placement lock places exactly fourteen, the rest
    // wait, and the exclusion constraint never has to step in.
    let (app, who) = world().await;
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let app_pool = app.pool.clone();
        let who = who.clone();
        tasks.push(tokio::spawn(async move {
            let req = gpuslice::domain::booking::BookingInput {
                tenant: "lab".into(),
                kind: "mig".into(),
                profile: "1g.10gb".into(),
                hours: "2".into(),
                ..Default::default()
            }
            .parse()
            .unwrap();
            match gpuslice::booking::create(&app_pool, &who, &req, None, &Default::default())
                .await
                .unwrap()
            {
                gpuslice::booking::Created::New(b) => b.status.as_str().to_string(),
                gpuslice::booking::Created::Replayed(_) => unreachable!(),
            }
        }));
    }
    let mut scheduled = 0;
    for t in tasks {
        if t.await.unwrap() == "scheduled" {
            scheduled += 1;
        }
    }
    assert_eq!(scheduled, 14, "every slot of the two GPUs is used once");
    check(&app, Kind::Mig, "after the burst").await;
}

#[tokio::test]
async fn the_change_log_is_trimmed_below_an_hour_old_mark() {
    let (app, who) = world().await;
    book(&app, &who, "mig", "1g.10gb", 2).await;
    // The index has read the change (as every index in use has, once the
    // mark is an hour old).
    check(&app, Kind::Mig, "before trimming").await;
    let logged: i64 = app.one("SELECT count(*) FROM placement_changes").await;
    assert!(logged > 0);
    // A mark taken now removes nothing; one from over an hour ago removes
    // what was logged before it.
    assert_eq!(
        gpuslice::db::bookings::trim_changes(&app.pool)
            .await
            .unwrap(),
        0
    );
    // (The horizon is cluster-wide: other tests' transactions may hold it
    // back, so the mark is given this transaction's id, above every change.)
    sqlx::query("UPDATE placement_change_marks SET at = now() - interval '61 minutes', horizon = pg_current_xact_id()")
        .execute(&app.pool)
        .await
        .unwrap();
    let removed = gpuslice::db::bookings::trim_changes(&app.pool)
        .await
        .unwrap();
    assert_eq!(removed as i64, logged, "everything below the old mark went");
    // The index looked before that mark: the database tells it changes it
    // never read may be gone, so it loads in full (whatever its clock says).
    assert!(
        check(&app, Kind::Mig, "just after trimming")
            .await
            .full_reload
    );
    let marks: i64 = app.one("SELECT count(*) FROM placement_change_marks").await;
    assert_eq!(marks, 2, "the old mark in use and this round's");
    check(&app, Kind::Mig, "after trimming").await;
}

#[tokio::test]
async fn a_long_transaction_elsewhere_costs_the_index_nothing() {
    let (app, who) = world().await;
    check(&app, Kind::Mig, "empty").await;
    // A transaction that has written something and stays open (a long
    // export, an idle session): it holds the cluster's oldest running id.
    let mut long = app.pool.begin().await.unwrap();
    sqlx::query("UPDATE users SET display_name = display_name WHERE email = 'ana@uni.edu'")
        .execute(&mut *long)
        .await
        .unwrap();
    for _ in 0..3 {
        book(&app, &who, "mig", "1g.10gb", 2).await;
    }
    check(&app, Kind::Mig, "three bookings").await;
    let s = check(&app, Kind::Mig, "nothing new").await;
    assert_eq!(
        (s.full_reload, s.reread),
        (false, 0),
        "bookings already read are not read again while the long transaction runs"
    );
    long.commit().await.unwrap();
    check(&app, Kind::Mig, "after it ends").await;
}

#[tokio::test]
async fn a_booking_holds_its_slot_for_every_second_it_touches() {
    // Bookings start on whole seconds, but a release ends one at the
    // moment it happens (a fraction of a second). The index works in whole
    // seconds: it must count such a booking until the end of its last
    // second, or a booking placed into the rest of that second trips the
    // exclusion constraint on every try (a 500 after five).
    let (app, who) = world().await;
    let a = book(&app, &who, "mig", "1g.10gb", 1).await;
    // Two hours ahead, on a whole second: A ends 0.3 s after it.
    let (t,): (time::OffsetDateTime,) =
        sqlx::query_as("SELECT date_trunc('second', now()) + interval '2 hours'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    sqlx::query(
        "UPDATE bookings SET during = tstzrange($2 - interval '1 hour', $2 + interval '0.3 seconds') WHERE id = $1",
    )
    .bind(a.id)
    .bind(t)
    .execute(&app.pool)
    .await
    .unwrap();
    check(&app, Kind::Mig, "after the fractional end").await;
    // B starts at that whole second, with the same profile: it must go to
    // another slot (A still holds its own for 0.3 s), not A's.
    let b = book_from(&app, &who, "mig", "1g.10gb", 1, Some(t)).await;
    assert_eq!(b.status.as_str(), "scheduled");
    assert!(
        (b.gpu_id, b.slice_start) != (a.gpu_id, a.slice_start),
        "B took A's slot: {b:?}"
    );
    // A start asked for within a second is booked from that whole second.
    let later = t + time::Duration::hours(3);
    let c = book_from(
        &app,
        &who,
        "mig",
        "1g.10gb",
        1,
        Some(later + time::Duration::milliseconds(700)),
    )
    .await;
    assert_eq!(c.start, later);
}
