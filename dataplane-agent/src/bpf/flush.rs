//! Writing a planned batch into the maps ([`MapSync::flush`]): every put, then every flip,
//! then every delete. A put or flip that fails undoes what the batch wrote and rolls its plans
//! back, and its services are written again one at a time. Frontend deletes that a later
//! flush of the same sync may write over (a VIP moving between services) are held until the
//! sync's end ([`MapSync::drop_held`]), so the key is never absent meanwhile.

use foldhash::HashSet;

use super::{
    maps::{FeKey, MapKind, MapOp, MapWriteError, MapWriter},
    sync::{Change, MapSync, Outcome, SyncError, SyncReport},
};

/// The frontend deletes a flush holds back until [`MapSync::drop_held`]: those a later flush
/// of the sync may write over (a VIP moving between services).
#[derive(Clone, Copy)]
pub(super) enum Hold<'a> {
    Nothing,
    /// A full batch: what later batches write is not known yet.
    All,
    /// A failed batch redone service by service: the keys it wrote.
    Keys(&'a HashSet<FeKey>),
}

impl Hold<'_> {
    pub(super) fn holds(self, key: &FeKey) -> bool {
        match self {
            Hold::Nothing => false,
            Hold::All => true,
            Hold::Keys(keys) => keys.contains(key),
        }
    }
}

impl MapSync {
    /// Deletes the frontends that flushes held back and no later change took over.
    pub(super) fn drop_held(&mut self, maps: &mut impl MapWriter, out: &mut Outcome) {
        let held = std::mem::take(&mut out.held);
        let batch = self.plan_drops(held, maps, &mut out.report.undeleted);
        // Deletes only: nothing to undo. Their services were reported changed already.
        let mut dropped = Outcome::default();
        self.flush(batch, maps, &mut dropped, Hold::Nothing);
        let r = dropped.report;
        out.report.writes += r.writes;
        out.report.delete_errors.extend(r.delete_errors);
        out.report.undeleted.extend(r.undeleted);
    }

    /// Writes a batch: every put, then every flip, then every delete. If a put or a flip
    /// fails, everything the batch wrote is undone and its plans rolled back, then its services
    /// are written again one at a time: the one that fails is reported and left as it was.
    /// The frontend deletes `hold` names wait in the mirror for [`MapSync::drop_held`], so that
    /// a later flush of the sync that writes the key over never finds it absent.
    pub(super) fn flush(
        &mut self,
        batch: Vec<Change>,
        maps: &mut impl MapWriter,
        out: &mut Outcome,
        hold: Hold<'_>,
    ) {
        if batch.is_empty() {
            return;
        }
        // Phase 1. Nothing points at what the puts write until the flips, so their order
        // across maps does not matter: grouped by map, they go in few syscalls. Phase 2: the
        // flips, grouped by map too (each one is atomic on its own).
        let (puts, put_owners) = gather(&batch, |c| c.puts.iter().map(|(op, _)| op));
        let (flips, flip_owners) = gather(&batch, |c| c.flips.iter().map(|(op, _)| op));
        let failed = match maps.apply_all(&puts) {
            Err((at, e)) => Some((at, 0, e)),
            Ok(()) => maps
                .apply_all(&flips)
                .err()
                .map(|(at, e)| (puts.len(), at, e)),
        };
        if let Some((puts_done, flips_done, e)) = failed {
            let report = &mut out.report;
            undo(
                &batch,
                &flips[..flips_done],
                &flip_owners,
                flip_undos,
                maps,
                report,
            );
            undo(
                &batch,
                &puts[..puts_done],
                &put_owners,
                |c| &c.puts[..],
                maps,
                report,
            );
            self.redo_alone(batch, e, maps, out, hold);
            return;
        }
        out.report.writes += puts.iter().map(MapOp::entries).sum::<usize>() + flips.len();
        let mut batch = batch;
        for change in &mut batch {
            let held: Vec<MapOp> = change
                .deletes
                .extract_if(
                    ..,
                    |op| matches!(op, MapOp::DelFrontend(k) if hold.holds(k)),
                )
                .collect();
            for op in held {
                if let MapOp::DelFrontend(key) = op
                    && let Some((addr, inst)) = change.keep_undeleted(key)
                {
                    out.held.push((inst.service.clone(), addr));
                    self.keep_entry(addr, inst);
                }
            }
        }
        let report = &mut out.report;
        // Phase 3. A delete that fails is tried once more, then reported, not undone. Most
        // leave an entry nothing points at; a frontend's own entry still routes, so its id,
        // slot range and cluster names are kept from reuse (or the old VIP would serve what
        // they get next), and the mirror keeps it as its service's for the next sync of that
        // service to delete.
        let (deletes, owners) = gather(&batch, |c| c.deletes.iter());
        let mut at = 0;
        while let Err((i, e)) = maps.apply_all(&deletes[at..]) {
            report.writes += i;
            at += i;
            if maps.apply(&deletes[at]).is_ok() {
                report.writes += 1;
            } else {
                if let (MapOp::DelFrontend(key), Some(owner)) = (&deletes[at], owners.get(at))
                    && let Some((addr, inst)) = batch[*owner].keep_undeleted(*key)
                {
                    report.undeleted.push(inst.service.clone());
                    self.keep_entry(addr, inst);
                }
                report.delete_errors.push(e);
            }
            at += 1;
        }
        report.writes += deletes.len() - at;
        for change in batch {
            self.finish(change, report);
        }
        self.collect_clusters(maps, report);
    }

    /// After a failed batch (the maps and the mirror as they were before it): writes each of
    /// its services in a batch of its own, or reports the only one.
    fn redo_alone(
        &mut self,
        batch: Vec<Change>,
        error: MapWriteError,
        maps: &mut impl MapWriter,
        out: &mut Outcome,
        hold: Hold<'_>,
    ) {
        // A service redone later may write over what one redone earlier removes; so may a
        // later batch, when the batch was held whole.
        let written: HashSet<FeKey> = batch.iter().flat_map(Change::keys_written).collect();
        let hold = match hold {
            Hold::All => Hold::All,
            Hold::Nothing | Hold::Keys(_) => Hold::Keys(&written),
        };
        let mut desired = Vec::new();
        for change in batch.into_iter().rev() {
            desired.push(self.rollback(change));
        }
        desired.reverse();
        if desired.len() == 1 {
            if let Some(d) = desired.pop() {
                let e = SyncError::Write {
                    service: d.service.clone(),
                    source: error,
                };
                out.failed.push((d, e));
            }
            return;
        }
        for d in desired {
            match self.plan(&d, maps) {
                Ok(Some(mut change)) => {
                    change.desired = Some(d);
                    self.flush(vec![change], maps, out, hold);
                }
                Ok(None) => {}
                Err(e) => out.failed.push((d, e)),
            }
        }
    }
}

/// Every op of `part` of every change, grouped by map (stable, so a change's own order holds
/// within a map), with the index of the change each op belongs to.
fn gather<'b, I>(batch: &'b [Change], part: impl Fn(&'b Change) -> I) -> (Vec<MapOp>, Vec<usize>)
where
    I: Iterator<Item = &'b MapOp>,
{
    let mut all: Vec<(MapKind, usize, &MapOp)> = batch
        .iter()
        .enumerate()
        .flat_map(|(i, c)| part(c).map(move |op| (op.map(), i, op)))
        .collect();
    all.sort_by_key(|(kind, _, _)| *kind);
    let owners = all.iter().map(|(_, i, _)| *i).collect();
    (
        all.into_iter().map(|(_, _, op)| op.clone()).collect(),
        owners,
    )
}

fn flip_undos(c: &Change) -> &[(MapOp, MapOp)] {
    &c.flips
}

/// Something that can be taken back: a put (maybe without an undo) or a flip.
trait Undoable {
    fn op(&self) -> &MapOp;
    fn undo(&self) -> Option<&MapOp>;
}

impl Undoable for (MapOp, Option<MapOp>) {
    fn op(&self) -> &MapOp {
        &self.0
    }
    fn undo(&self) -> Option<&MapOp> {
        self.1.as_ref()
    }
}

impl Undoable for (MapOp, MapOp) {
    fn op(&self) -> &MapOp {
        &self.0
    }
    fn undo(&self) -> Option<&MapOp> {
        Some(&self.1)
    }
}

/// Takes back `applied` (a prefix of a gathered phase, owners alongside), last first, with the
/// undo each change recorded for the op. An undo that fails leaves an entry nothing points at
/// (puts) or the old entry not restored (flips); it is reported.
fn undo<U: Undoable>(
    batch: &[Change],
    applied: &[MapOp],
    owners: &[usize],
    part: impl Fn(&Change) -> &[U],
    maps: &mut impl MapWriter,
    report: &mut SyncReport,
) {
    for (op, owner) in applied.iter().zip(owners).rev() {
        let undo = part(&batch[*owner])
            .iter()
            .find(|u| u.op() == op)
            .and_then(Undoable::undo);
        if let Some(undo) = undo
            && let Err(e) = maps.apply(undo)
        {
            report.delete_errors.push(e);
        }
    }
}
