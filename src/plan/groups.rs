//! Plan by observation: the selected trials grouped by what the engine must
//! produce — (model, the observation the case declares) — so that each
//! group is one decode however many cases read it; the reference work of
//! every trial folded into the group of its reference model and the same
//! observation (a group of its own, with no trial, when no case runs the
//! reference model there); and an order in which every group runs after
//! the groups whose references it reads.
//!
//! Contract: answered from the parsed cases alone, before any model loads;
//! a trial that decodes on its own (generation) or did not parse is a group
//! of its own; every selected trial is in exactly one group.

use crate::plan::Planned;
use std::collections::HashMap;

/// Trials decoded together, and the reference work done in the same decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The model every trial of the group runs on.
    pub model: String,
    /// The declared observation (None: a trial decoding on its own).
    pub observation: Option<String>,
    /// The trials (indices into the plan).
    pub trials: Vec<usize>,
    /// Trials (indices into the plan) whose reference products this group
    /// builds from its model's rows.
    pub provides: Vec<usize>,
    /// Groups (indices into the list) whose reference products this
    /// group's trials read: they run first.
    pub after: Vec<usize>,
    /// About how many token rows the group decodes (its heaviest trial's
    /// [`crate::kinds::Kind::weight`]); groups start heaviest first.
    pub weight: usize,
    /// Whether a trial of it decides sequentially over windows of a text:
    /// such a group starts after the others, whose decodes keep the
    /// windows it may visit (a kld case's 16 windows of a text are a
    /// sequential ΔNLL case's first 16 of it), so that it reads them
    /// instead of decoding them.
    pub sequential: bool,
}

impl Group {
    /// An empty group of `model` and `observation`, appended to `groups`;
    /// its index.
    fn push(groups: &mut Vec<Group>, model: &str, observation: Option<String>) -> usize {
        groups.push(Group {
            model: model.to_string(),
            observation,
            trials: Vec::new(),
            provides: Vec::new(),
            after: Vec::new(),
            weight: 0,
            sequential: false,
        });
        groups.len() - 1
    }

    /// A group with no trial of its own: only reference work.
    pub fn reference_only(&self) -> bool {
        self.trials.is_empty()
    }
}

/// Group the selected trials of `planned` (`selected[i]`) by observation;
/// with `share` off every trial is a group of its own (and builds its
/// references itself). Returned in an order where every group comes after
/// the groups it reads references from, groups that provide references
/// first (a cycle of references is cut, the later group then builds its
/// own).
pub fn groups(planned: &[Planned], selected: &[bool], share: bool) -> Vec<Group> {
    let mut out: Vec<Group> = Vec::new();
    let mut by_key: HashMap<(String, String), usize> = HashMap::new();
    let mut group_of: HashMap<usize, usize> = HashMap::new();
    for (i, p) in planned.iter().enumerate() {
        if !selected.get(i).copied().unwrap_or(false) {
            continue;
        }
        let declared = p
            .case
            .as_ref()
            .ok()
            .and_then(|c| c.kind.observation())
            .filter(|_| share);
        // A sequential case's trials on every model are one group (its
        // reference windows, decoded as candidates need them, are shared
        // in one process), and so are a case's whose candidates read their
        // reference's rows live.
        let joint = p
            .case
            .as_ref()
            .ok()
            .filter(|c| share && c.kind.runs_jointly())
            .map(|c| format!("joint {}", c.case.name));
        let g = match (declared, joint) {
            (Some(d), joint) => *by_key
                .entry((joint.unwrap_or_else(|| p.model.clone()), d.clone()))
                .or_insert_with(|| Group::push(&mut out, &p.model, Some(d))),
            // A sequential kind without a declared observation (multiple
            // choice): still one group, one process.
            (None, Some(joint)) => *by_key
                .entry((joint, String::new()))
                .or_insert_with(|| Group::push(&mut out, &p.model, None)),
            (None, None) => Group::push(&mut out, &p.model, None),
        };
        let w = p.case.as_ref().map_or(0, |c| c.kind.weight());
        out[g].weight = out[g].weight.max(w);
        out[g].sequential |= p
            .case
            .as_ref()
            .is_ok_and(|c| c.kind.decides_sequentially() && c.kind.sequential_unit() == "window");
        out[g].trials.push(i);
        group_of.insert(i, g);
    }
    if share {
        for (i, p) in planned.iter().enumerate() {
            let Some(&own) = group_of.get(&i) else {
                continue;
            };
            let Ok(parsed) = &p.case else { continue };
            let (Some((reference, _)), Some(d)) =
                (&parsed.case.reference, parsed.kind.reference_observation())
            else {
                continue;
            };
            let g = *by_key
                .entry((reference.clone(), d.clone()))
                .or_insert_with(|| Group::push(&mut out, reference, Some(d)));
            out[g].provides.push(i);
            out[g].weight = out[g].weight.max(parsed.kind.weight());
            if g != own && !out[own].after.contains(&g) {
                out[own].after.push(g);
            }
        }
    }
    order(out)
}

/// Kahn's algorithm: of the ready groups, those that provide references
/// first, then those that do not decide sequentially over windows (their
/// decodes keep windows a sequential case reads), then the heaviest (counting the
/// reference-only groups it runs first), then the first planned; what a cycle leaves is appended in index
/// order with the edges into the cycle dropped.
fn order(groups: Vec<Group>) -> Vec<Group> {
    let n = groups.len();
    let load: Vec<usize> = (0..n)
        .map(|g| {
            groups[g].weight
                + groups[g]
                    .after
                    .iter()
                    .filter(|&&a| groups[a].reference_only())
                    .map(|&a| groups[a].weight)
                    .sum::<usize>()
        })
        .collect();
    let mut placed = vec![false; n];
    let mut seq = Vec::with_capacity(n);
    while seq.len() < n {
        let ready = (0..n)
            .filter(|&g| !placed[g] && groups[g].after.iter().all(|&a| placed[a]))
            .min_by_key(|&g| {
                (
                    groups[g].provides.is_empty(),
                    groups[g].sequential,
                    std::cmp::Reverse(load[g]),
                    g,
                )
            });
        // A cycle: take the first group left; its unplaced providers are
        // dropped from its `after` below.
        let g = ready.unwrap_or_else(|| (0..n).find(|&g| !placed[g]).expect("one is left"));
        placed[g] = true;
        seq.push(g);
    }
    let new_index: HashMap<usize, usize> = seq.iter().enumerate().map(|(k, &g)| (g, k)).collect();
    seq.iter()
        .map(|&g| {
            let mut grp = groups[g].clone();
            let here = new_index[&g];
            grp.after = grp
                .after
                .iter()
                .map(|a| new_index[a])
                .filter(|&a| a < here)
                .collect();
            grp
        })
        .collect()
}
