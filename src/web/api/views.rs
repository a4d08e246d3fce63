//! What the JSON API answers: one `Serialize` view struct per answer, each
//! also described for the OpenAPI document (`ToSchema`), so the document
//! and the answers cannot drift apart.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::db::bookings::Booking;
use crate::domain::booking::{Kind, Status};
use crate::domain::Priority;
use crate::web::bookings::rfc3339;

/// An error: a code, a sentence, and for invalid input one message per
/// field.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// `unauthenticated`, `forbidden`, `not_found`, `bad_request`,
    /// `conflict`, `unprocessable`, `too_many_requests`, `internal`, ...
    pub error: String,
    pub message: String,
    /// With 422 for invalid input: field name -> message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fields: Option<BTreeMap<String, String>>,
}

/// Where a MIG booking sits on its GPU: memory slices `[start, start+size)`.
#[derive(Debug, Serialize, ToSchema)]
pub struct PlacementView {
    pub start: i32,
    pub size: i32,
}

/// A container inside a booking: Docker or Podman (with the `cgroupfs`
/// cgroup driver) puts it under the booking's cgroup, so its limits, turns
/// and device confinement hold.
#[derive(Debug, Serialize, ToSchema)]
pub struct ContainerView {
    /// `--cgroup-parent` for the container runtime.
    pub cgroup_parent: String,
    /// `docker run` arguments before the image.
    pub docker_args: Vec<String>,
}

/// A booking.
#[derive(Debug, Serialize, ToSchema)]
pub struct BookingView {
    pub id: i64,
    /// The tenant's slug.
    pub tenant: String,
    /// The owner's e-mail.
    pub user: String,
    pub kind: Kind,
    /// The GPU model placed on, or the one asked for.
    pub model: Option<String>,
    /// The MIG profile (MIG bookings only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// RFC 3339.
    #[schema(format = DateTime)]
    pub start: String,
    #[schema(format = DateTime)]
    pub end: String,
    pub hours: i32,
    pub status: Status,
    pub priority: Priority,
    pub memory_gib: i32,
    pub compute_slices: i32,
    /// The GPU's uuid, once placed.
    pub gpu: Option<String>,
    pub node: Option<String>,
    /// MIG only, once placed.
    pub placement: Option<PlacementView>,
    /// The device to use (`MIG-…` or the GPU's `GPU-…`), once active.
    pub device_uuid: Option<String>,
    /// The device files its processes may open (the rest of NVIDIA's are
    /// denied to its cgroup), once active on a node that confines them.
    pub device_nodes: Vec<String>,
    /// How to run a container inside the booking (its cgroup and device),
    /// once active.
    pub container: Option<ContainerView>,
    /// Why it waits (queued) or failed.
    pub reason: Option<String>,
    /// For a queued booking: the earliest start that would fit.
    #[schema(format = DateTime)]
    pub earliest_start: Option<String>,
    /// While an active booking is idle (its tenant reclaims idle GPUs):
    /// since when, when its owner was warned, when it will be released.
    pub idle: Option<IdleView>,
    /// Once ended: the smallest slice that would have served it (from its
    /// measured peak memory and utilisation), when smaller than its own.
    pub advice: Option<crate::domain::rightsize::Advice>,
    /// An active share's scheduler state: slice, priority, achieved part.
    #[schema(value_type = Option<Object>)]
    pub scheduler: Option<Value>,
    #[schema(format = DateTime)]
    pub created_at: String,
}

impl From<&Booking> for BookingView {
    fn from(b: &Booking) -> Self {
        BookingView {
            id: b.id,
            tenant: b.tenant_slug.clone(),
            user: b.user_email.clone(),
            kind: b.kind,
            model: b.model.clone().or(b.requested_model.clone()),
            profile: b.profile.clone(),
            start: rfc3339(b.start),
            end: rfc3339(b.end),
            hours: b.hours,
            status: b.status,
            priority: b.priority,
            memory_gib: b.memory_gib,
            compute_slices: b.compute_slices,
            gpu: b.gpu_uuid.clone(),
            node: b.node.clone(),
            placement: match (b.slice_start, b.slice_end) {
                (Some(s), Some(e)) => Some(PlacementView {
                    start: s,
                    size: e - s,
                }),
                _ => None,
            },
            device_uuid: b.device_uuid.clone(),
            device_nodes: if b.status == Status::Active {
                crate::sched::devices::from_json(b.device_nodes.as_ref())
                    .into_iter()
                    .map(|d| d.path)
                    .collect()
            } else {
                Vec::new()
            },
            container: match (&b.node, &b.device_uuid) {
                (Some(node), Some(device)) if b.status == Status::Active => Some(ContainerView {
                    cgroup_parent: crate::sched::container::cgroup_parent(node, b.id),
                    docker_args: crate::sched::container::docker_args(node, b.id, device),
                }),
                _ => None,
            },
            reason: b.reason.clone(),
            earliest_start: b.offered_start.map(rfc3339),
            idle: b
                .idle_since
                .filter(|_| b.status == Status::Active)
                .map(|since| IdleView {
                    since: rfc3339(since),
                    warned_at: b.idle_warned_at.map(rfc3339),
                    release_at: b.idle_release_at.map(rfc3339),
                }),
            advice: b.advice(),
            scheduler: (b.kind == Kind::Timeslice && b.status == Status::Active)
                .then(|| b.scheduler.clone())
                .flatten(),
            created_at: rfc3339(b.created_at),
        }
    }
}

/// An idle booking's clock (`POST /bookings/{id}/keep` starts it again).
#[derive(Debug, Serialize, ToSchema)]
pub struct IdleView {
    #[schema(format = DateTime)]
    pub since: String,
    #[schema(format = DateTime)]
    pub warned_at: Option<String>,
    /// With a `release` policy, once warned.
    #[schema(format = DateTime)]
    pub release_at: Option<String>,
}

/// `GET /bookings`.
#[derive(Debug, Serialize, ToSchema)]
pub struct BookingList {
    /// Newest first.
    pub bookings: Vec<BookingView>,
    /// Pass as `cursor` for the next (older) page; null on the last.
    pub next_cursor: Option<String>,
}

/// A new booking (`POST /bookings`). Numbers may also be given as strings.
#[derive(Debug, Serialize, ToSchema)]
pub struct BookingBody {
    /// Your tenant's slug.
    pub tenant: String,
    pub kind: Kind,
    /// A catalog model id such as `H100-80GB`; omitted: any.
    pub model: Option<String>,
    /// MIG: a profile such as `1g.10gb`.
    pub profile: Option<String>,
    /// Time-sliced share: GPU memory in GiB.
    pub memory_gib: Option<i32>,
    /// Time-sliced share: omitted, the tenant's default.
    pub priority: Option<Priority>,
    /// RFC 3339; omitted: now.
    #[schema(format = DateTime)]
    pub start: Option<String>,
    pub hours: i32,
}

/// `POST /bookings/{id}/release`: a reason is needed to end someone
/// else's booking.
#[derive(Debug, Default, serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {
    pub reason: Option<String>,
}

/// `POST /bookings/{id}/extend`.
#[derive(Debug, serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtendBody {
    /// Hours to add.
    #[serde(deserialize_with = "whole_number")]
    pub hours: i32,
}

/// `GET /offerings`.
#[derive(Debug, Serialize, ToSchema)]
pub struct OfferingList {
    pub offerings: Vec<crate::booking::Offering>,
}

/// A tenant the caller belongs to.
#[derive(Debug, Serialize, ToSchema)]
pub struct MembershipView {
    pub slug: String,
    pub name: String,
    /// `member` or `manager`.
    pub role: String,
    pub archived: bool,
}

/// `GET /me`.
#[derive(Debug, Serialize, ToSchema)]
pub struct MeView {
    pub id: i64,
    pub email: String,
    pub display_name: String,
    /// `admin`, `finance` or `none`.
    pub global_role: String,
    pub tenants: Vec<MembershipView>,
}

/// A tenant with its quota.
#[derive(Debug, Serialize, ToSchema)]
pub struct TenantView {
    pub slug: String,
    pub name: String,
    pub archived: bool,
    pub quota: crate::domain::Quota,
}

/// `GET /tenants`.
#[derive(Debug, Serialize, ToSchema)]
pub struct TenantList {
    pub tenants: Vec<TenantView>,
}

/// Usage of one booking on one UTC day.
#[derive(Debug, Serialize, ToSchema)]
pub struct UsageRow {
    #[schema(format = Date)]
    pub date: String,
    pub tenant: String,
    pub user: String,
    pub booking: i64,
    pub kind: String,
    pub model: String,
    /// The MIG profile, or `12 GiB share`.
    pub profile_or_share: String,
    pub slice_seconds: f64,
    pub slice_hours: f64,
    pub gib_hours: f64,
    /// By the tariff in force that day; null when none covers it.
    pub cost: Option<f64>,
}

/// `GET /usage`.
#[derive(Debug, Serialize, ToSchema)]
pub struct UsageReport {
    #[schema(format = Date)]
    pub from: String,
    #[schema(format = Date)]
    pub to: String,
    /// ISO 4217 code of `cost`.
    pub currency: String,
    pub usage: Vec<UsageRow>,
}

/// An alert.
#[derive(Debug, Serialize, ToSchema)]
pub struct AlertView {
    pub id: i64,
    pub rule: String,
    pub severity: crate::domain::alerts::Severity,
    pub state: crate::domain::alerts::AlertState,
    pub subject: crate::domain::alerts::Subject,
    pub value: Option<f64>,
    pub message: String,
    /// RFC 3339.
    pub started_at: String,
    /// RFC 3339, once resolved.
    pub resolved_at: Option<String>,
    pub acknowledged: bool,
}

impl From<crate::db::alerts::Alert> for AlertView {
    fn from(a: crate::db::alerts::Alert) -> Self {
        AlertView {
            subject: a.subject(),
            id: a.id,
            rule: a.rule,
            severity: a.severity,
            state: a.state,
            value: a.value,
            message: a.message,
            started_at: rfc3339(a.started_at),
            resolved_at: a.resolved_at.map(rfc3339),
            acknowledged: a.acked_at.is_some(),
        }
    }
}

/// A whole number, also when written with a zero fraction (`1.0` is the
/// integer 1 to JSON Schema).
fn whole_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    let n = <f64 as serde::Deserialize>::deserialize(d)?;
    if n.fract() == 0.0 && n >= f64::from(i32::MIN) && n <= f64::from(i32::MAX) {
        Ok(n as i32)
    } else {
        Err(serde::de::Error::custom("give a whole number"))
    }
}
