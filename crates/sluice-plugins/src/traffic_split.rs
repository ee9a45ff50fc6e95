//! traffic-split (priority 966, access): the first of `rules` whose `match` passes (any of its `vars`
//! expressions; a rule without `match` always passes) splits requests over its `weighted_upstreams` by weight,
//! round-robin, as APISIX's resty.roundrobin does. An entry names an `upstream_id`, an inline `upstream`, or
//! neither, which means the route's own upstream. The plugin declares its upstreams through
//! [`Plugin::upstreams`]; the proxy compiles them with the route (balancers, pools, health) and this hook only
//! picks an index ([`Ctx::pick_upstream`]). When no rule matches, the route's upstream serves the request.
//! Not here: compiling or contacting upstreams (sluice-proxy's snapshot and conn).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};
use sluice_router::expr::Expr;

use crate::registry::Entry;
use crate::util::parse;
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin, PluginUpstream};

pub const NAME: &str = "traffic-split";
pub const PRIORITY: i32 = 966;

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: false,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields::NONE,
};

/// Above this total weight the pick walks cumulative weights instead of a precomputed interleaved sequence.
const MAX_SEQUENCE: u64 = 4096;

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "rules": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "match": {"type": "array", "items": {
                            "type": "object",
                            "properties": {"vars": {"type": "array"}}
                        }},
                        "weighted_upstreams": {
                            "type": "array",
                            "items": {"type": "object", "properties": {
                                "upstream_id": sluice_model::schema::id_schema(),
                                "upstream": sluice_model::schema::upstream(),
                                "weight": {"type": "integer", "default": 1, "minimum": 0}
                            }},
                            "default": [{"weight": 1}],
                            "minItems": 1,
                            "maxItems": 20
                        }
                    },
                    "additionalProperties": false
                }
            }
        },
        "additionalProperties": false
    })
}

#[derive(Deserialize)]
struct Conf {
    #[serde(default)]
    rules: Vec<RuleConf>,
}

#[derive(Deserialize)]
struct RuleConf {
    #[serde(rename = "match")]
    matches: Option<Vec<MatchConf>>,
    #[serde(default = "default_upstreams")]
    weighted_upstreams: Vec<WeightedConf>,
}

#[derive(Deserialize)]
struct MatchConf {
    #[serde(default)]
    vars: Value,
}

#[derive(Deserialize)]
struct WeightedConf {
    upstream_id: Option<Value>,
    upstream: Option<Box<sluice_model::Upstream>>,
    #[serde(default = "one")]
    weight: u64,
}

fn one() -> u64 {
    1
}

fn default_upstreams() -> Vec<WeightedConf> {
    vec![WeightedConf {
        upstream_id: None,
        upstream: None,
        weight: 1,
    }]
}

fn vars_expr(vars: &Value) -> Result<Expr, String> {
    let rule = if vars.is_null() {
        json!([])
    } else {
        vars.clone()
    };
    Expr::compile(&rule).map_err(|e| format!("failed to validate the 'vars' expression: {e}"))
}

fn check(v: &Value) -> Result<(), String> {
    let c: Conf = parse(&schema(), v)?;
    for m in c.rules.iter().flat_map(|r| r.matches.iter().flatten()) {
        vars_expr(&m.vars)?;
    }
    Ok(())
}

/// One rule: when it applies and where its requests go.
struct Rule {
    /// `None`: no `match`, the rule always applies.
    matches: Option<Vec<Expr>>,
    split: Split,
}

/// Weighted round-robin over targets (`None`: the route's own upstream).
struct Split {
    targets: Vec<Option<u32>>,
    pick: Pick,
    next: AtomicU64,
}

enum Pick {
    /// Every weight is 0: the route's upstream.
    Nothing,
    /// An interleaved sequence of target indexes, one round of the smooth weighted round-robin.
    Sequence(Vec<u32>),
    /// Cumulative weights (large totals).
    Cumulative(Vec<u64>),
}

impl Split {
    fn new(targets: Vec<Option<u32>>, weights: &[u64]) -> Split {
        let total: u64 = weights.iter().sum();
        let pick = if total == 0 {
            Pick::Nothing
        } else if total <= MAX_SEQUENCE {
            // Smooth weighted round-robin (as nginx's upstream rr): each target in proportion, spread out.
            let mut current = vec![0i64; weights.len()];
            let seq = (0..total)
                .map(|_| {
                    let mut best = 0;
                    for (i, w) in weights.iter().enumerate() {
                        current[i] += *w as i64;
                        if current[i] > current[best] {
                            best = i;
                        }
                    }
                    current[best] -= total as i64;
                    best as u32
                })
                .collect();
            Pick::Sequence(seq)
        } else {
            Pick::Cumulative(
                weights
                    .iter()
                    .scan(0, |acc, w| {
                        *acc += w;
                        Some(*acc)
                    })
                    .collect(),
            )
        };
        Split {
            targets,
            pick,
            next: AtomicU64::new(0),
        }
    }

    fn choose(&self) -> Option<u32> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let i = match &self.pick {
            Pick::Nothing => return None,
            Pick::Sequence(seq) => seq[(n % seq.len() as u64) as usize] as usize,
            Pick::Cumulative(cum) => {
                let total = cum.last().copied().unwrap_or(1);
                let r = n % total;
                cum.partition_point(|c| *c <= r)
            }
        };
        self.targets.get(i).copied().flatten()
    }
}

struct TrafficSplit {
    rules: Vec<Rule>,
    upstreams: Vec<PluginUpstream>,
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    if env.consumer_scope().is_some() {
        return Err(
            "traffic-split is supported on routes, services and plugin configs only".into(),
        );
    }
    let c: Conf = parse(&schema(), v)?;
    let mut upstreams: Vec<PluginUpstream> = Vec::new();
    let mut rules = Vec::with_capacity(c.rules.len());
    for r in c.rules {
        let matches = match &r.matches {
            None => None,
            Some(ms) => Some(
                ms.iter()
                    .map(|m| vars_expr(&m.vars))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        let mut targets = Vec::with_capacity(r.weighted_upstreams.len());
        let mut weights = Vec::with_capacity(r.weighted_upstreams.len());
        for w in r.weighted_upstreams {
            let up = match (w.upstream_id, w.upstream) {
                (Some(id), _) => Some(PluginUpstream::Id(match id {
                    Value::String(s) => s,
                    other => other.to_string(),
                })),
                (None, Some(u)) => Some(PluginUpstream::Inline(u.into())),
                (None, None) => None,
            };
            let target = up.map(|u| match upstreams.iter().position(|x| *x == u) {
                Some(i) => i as u32,
                None => {
                    upstreams.push(u);
                    (upstreams.len() - 1) as u32
                }
            });
            targets.push(target);
            weights.push(w.weight);
        }
        rules.push(Rule {
            matches,
            split: Split::new(targets, &weights),
        });
    }
    Ok(Arc::new(TrafficSplit { rules, upstreams }))
}

impl Plugin for TrafficSplit {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    fn phases(&self) -> PhaseMask {
        PhaseMask::of(&[Phase::Access])
    }
    fn upstreams(&self) -> &[PluginUpstream] {
        &self.upstreams
    }
    fn access(&self, ctx: &mut Ctx<'_>) -> Flow {
        let rule = self.rules.iter().find(|r| {
            r.matches
                .as_ref()
                .is_none_or(|ms| ms.is_empty() || ms.iter().any(|e| e.eval(&*ctx)))
        });
        if let Some(r) = rule {
            let pick = r.split.choose();
            ctx.pick_upstream(pick);
        }
        Flow::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(s: &Split, n: usize) -> Vec<usize> {
        let mut c = vec![0; s.targets.len() + 1];
        for _ in 0..n {
            match s.choose() {
                Some(i) => c[i as usize] += 1,
                None => c[s.targets.len()] += 1,
            }
        }
        c
    }

    #[test]
    fn weights_are_exact_over_each_round_and_interleaved() {
        let s = Split::new(vec![Some(0), Some(1), None], &[3, 1, 1]);
        assert_eq!(counts(&s, 50), vec![30, 10, 0, 10]);
        // Spread out: never more than 3 picks of the same target in a row.
        let seq: Vec<_> = (0..10).map(|_| s.choose()).collect();
        assert!(
            seq.windows(4).all(|w| w.iter().any(|x| *x != w[0])),
            "{seq:?}"
        );
    }

    #[test]
    fn zero_weights_and_large_totals() {
        let s = Split::new(vec![Some(0), Some(1)], &[0, 2]);
        assert_eq!(counts(&s, 10), vec![0, 10, 0]);
        let s = Split::new(vec![Some(0), Some(1)], &[0, 0]);
        assert_eq!(counts(&s, 4), vec![0, 0, 4]);
        let s = Split::new(vec![Some(0), Some(1)], &[10_000, 5_000]);
        assert_eq!(counts(&s, 30_000), vec![20_000, 10_000, 0]);
    }
}
