//! Label and field selectors, parsed from the `labelSelector` and `fieldSelector` query parameters.

use serde_json::Value;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed label selector: every requirement must hold (the comma is an AND).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LabelSelector(Vec<Req>);

/// A parsed field selector: `path=value`, `path==value` or `path!=value` terms, ANDed.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FieldSelector(Vec<(Vec<String>, bool, String)>);

/// Splits on commas outside parentheses, so `a in (x,y),b` is two terms.
fn terms(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(s[start..].trim());
    out.into_iter().filter(|t| !t.is_empty()).collect()
}

fn key(k: &str) -> Result<String, String> {
    let k = k.trim();
    if k.is_empty() || k.contains(char::is_whitespace) || k.contains(['!', '=', '(', ')']) {
        return Err(format!("invalid label key {k:?}"));
    }
    Ok(k.to_owned())
}

fn set(values: &str) -> Result<Vec<String>, String> {
    let inner = values
        .trim()
        .strip_prefix('(')
        .and_then(|v| v.strip_suffix(')'))
        .ok_or_else(|| format!("expected a parenthesised set, got {values:?}"))?;
    Ok(inner.split(',').map(|v| v.trim().to_owned()).collect())
}

impl LabelSelector {
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for t in terms(s) {
            let req = if let Some((k, v)) = t.split_once(" notin ") {
                Req::NotIn(key(k)?, set(v)?)
            } else if let Some((k, v)) = t.split_once(" in ") {
                Req::In(key(k)?, set(v)?)
            } else if let Some(k) = t.strip_prefix('!') {
                Req::NotExists(key(k)?)
            } else if let Some((k, v)) = t.split_once("!=") {
                Req::Ne(key(k)?, v.trim().to_owned())
            } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
                Req::Eq(key(k)?, v.trim().to_owned())
            } else {
                Req::Exists(key(t)?)
            };
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    pub(crate) fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            // As in Kubernetes, `k!=v` and `k notin (..)` also match objects without the label.
            Req::Ne(k, v) => get(k) != Some(v.as_str()),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
            Req::In(k, vs) => get(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Req::NotIn(k, vs) => get(k).is_none_or(|l| vs.iter().all(|v| v != l)),
        })
    }
}

impl FieldSelector {
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for t in terms(s) {
            let (path, eq, value) = if let Some((k, v)) = t.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
                (k, true, v)
            } else {
                return Err(format!("invalid field selector term {t:?}"));
            };
            let path: Vec<String> = path.trim().split('.').map(str::to_owned).collect();
            if path.iter().any(String::is_empty) {
                return Err(format!("invalid field path in {t:?}"));
            }
            reqs.push((path, eq, value.trim().to_owned()));
        }
        Ok(Self(reqs))
    }

    /// Any dotted path of the object can be selected; a missing field compares as "".
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(path, eq, want)| {
            let got = path
                .iter()
                .try_fold(obj, |v, k| v.get(k))
                .map(|v| match v {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                })
                .unwrap_or_default();
            (got == *want) == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors() {
        let obj = json!({"metadata": {"name": "a", "labels": {"app": "web", "tier": "fe"}}});
        let m = |s: &str| LabelSelector::parse(s).expect(s).matches(&obj);
        assert!(m("app=web"));
        assert!(m("app==web,tier"));
        assert!(!m("app!=web"));
        assert!(m("missing!=x"));
        assert!(m("!missing"));
        assert!(!m("!app"));
        assert!(m("app in (db, web),tier notin (be)"));
        assert!(!m("app in (db),tier"));
        assert!(m(""));
        assert!(LabelSelector::parse("a b").is_err());
        assert!(LabelSelector::parse("x in y").is_err());
    }

    #[test]
    fn field_selectors() {
        let obj = json!({"metadata": {"name": "a", "namespace": "n"}, "spec": {"port": 80}});
        let m = |s: &str| FieldSelector::parse(s).expect(s).matches(&obj);
        assert!(m("metadata.name=a,metadata.namespace==n"));
        assert!(!m("metadata.name!=a"));
        assert!(m("spec.port=80"));
        assert!(m("spec.nodeName="));
        assert!(FieldSelector::parse("metadata.name").is_err());
    }
}
