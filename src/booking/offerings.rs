//! What can be booked now, for the booking form and `GET offerings`, and
//! a tenant's use for the quota bars.

use sqlx::PgPool;
use time::{Duration, OffsetDateTime};

use super::decide::load_fleet;
use super::plan::Asked;
use super::{at, ts};
use crate::db;
use crate::domain::booking::{self as rules, Kind, SLICES_PER_GPU};
use crate::gpu::catalog;
use crate::placement::mig::{MigGpu, Window};
use crate::placement::shares::{Held as ShareHeld, SharedGpu};

/// What can be booked, with how much of it is free now (the API's answer
/// as is).
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct Offering {
    pub kind: Kind,
    pub model: String,
    /// MIG profile; `None` for time-sliced shares.
    pub profile: Option<String>,
    /// The profile's memory; for shares, the largest share free now.
    pub memory_gib: f64,
    /// The profile's compute slices (7 for a whole GPU).
    pub compute_slices: i32,
    /// GPUs that offer it.
    pub gpus: usize,
    /// GPUs that could take one more right now (for the next hour).
    pub available_now: usize,
}

/// Every profile and share kind the fleet offers, with availability now.
pub async fn offerings(pool: &PgPool) -> sqlx::Result<Vec<Offering>> {
    let mut tx = pool.begin().await?;
    let fleet = load_fleet(&mut tx, None, &[], &Asked::default()).await?;
    let (mig, shared) = (fleet.mig.gpus(), fleet.shared.gpus());
    tx.rollback().await?;
    let now = ts(OffsetDateTime::now_utc());
    let next_hour = Window {
        start: now,
        end: now + 3600,
    };
    let mut out: Vec<Offering> = Vec::new();
    let mut models: Vec<&'static catalog::Model> = mig.iter().map(|g| g.model).collect();
    models.sort_by_key(|m| m.id);
    models.dedup_by_key(|m| m.id);
    for model in models {
        let gpus: Vec<&MigGpu> = mig.iter().filter(|g| g.model.id == model.id).collect();
        for p in &model.profiles {
            let available = gpus
                .iter()
                .filter(|g| {
                    let present: Vec<crate::gpu::mig::Existing> = g
                        .bookings
                        .iter()
                        .filter(|b| b.window.overlaps(next_hour))
                        .map(|b| crate::gpu::mig::Existing {
                            profile_id: b.profile_id,
                            placement: b.placement,
                        })
                        .collect();
                    !crate::gpu::mig::free_placements(model, &present, p.nvml_id).is_empty()
                })
                .count();
            out.push(Offering {
                kind: Kind::Mig,
                model: model.id.to_string(),
                profile: Some(p.name.clone()),
                memory_gib: p.memory_gib,
                compute_slices: i32::from(p.compute_slices),
                gpus: gpus.len(),
                available_now: available,
            });
        }
    }
    let mut share_models: Vec<&str> = shared.iter().map(|g| g.model.as_str()).collect();
    share_models.sort_unstable();
    share_models.dedup();
    for model in share_models {
        let gpus: Vec<&SharedGpu> = shared.iter().filter(|g| g.model == model).collect();
        let free: Vec<f64> = gpus
            .iter()
            .filter_map(|g| {
                let here: Vec<&ShareHeld> = g
                    .held
                    .iter()
                    .filter(|h| h.window.overlaps(next_hour))
                    .collect();
                (here.len() < g.max_shares as usize)
                    .then(|| g.memory_gib - here.iter().map(|h| h.memory_gib).sum::<f64>())
                    .filter(|m| *m >= 1.0)
            })
            .collect();
        out.push(Offering {
            kind: Kind::Timeslice,
            model: model.to_string(),
            profile: None,
            memory_gib: free.iter().copied().fold(0.0, f64::max).floor(),
            compute_slices: SLICES_PER_GPU,
            gpus: gpus.len(),
            available_now: free.len(),
        });
    }
    Ok(out)
}

/// A tenant's use now and this month, for the quota bars.
#[derive(Debug, Clone)]
pub struct QuotaUse {
    pub active_bookings: i32,
    pub memory_gib: i32,
    pub compute_slices: i32,
    /// Slice-hours used and booked this calendar month (UTC).
    pub slice_hours: f64,
}

/// A tenant's use now (active bookings, GPU memory, compute slices) and
/// its slice-hours this month.
pub async fn quota_use(pool: &PgPool, tenant_id: i64) -> sqlx::Result<QuotaUse> {
    let now = OffsetDateTime::now_utc();
    let held =
        db::bookings::tenant_live_between(pool, tenant_id, now, now + Duration::seconds(1), None)
            .await?;
    let (n, mem, slices) = rules::peak_use(&held, ts(now), ts(now) + 1);
    let month = rules::months_touched(ts(now), ts(now) + 1)
        .first()
        .copied()
        .unwrap_or((ts(now), ts(now) + 1));
    let hours =
        db::bookings::tenant_slice_hours(pool, tenant_id, at(month.0), at(month.1), None).await?;
    Ok(QuotaUse {
        active_bookings: n,
        memory_gib: mem,
        compute_slices: slices,
        slice_hours: hours,
    })
}
