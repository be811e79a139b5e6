//! `Einsum` by broadcasting: every operand is permuted and reshaped onto one common letter
//! order (output letters first, then the summed ones), the operands are multiplied with
//! broadcasting, and the summed letters are reduced. Repeated letters within one operand
//! (diagonals) take the diagonal first with a gather. Ellipses (`...`) become fresh letters.

use super::{call, i64_tensor, v, Convert, Node};
use ferrofx_core::{Result, Tensor, Value};

fn parse(n: &Node<'_>, eq: &str, ranks: &[usize]) -> Result<(Vec<Vec<char>>, Vec<char>)> {
    let eq: String = eq.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (eq.clone(), None),
    };
    let parts: Vec<&str> = lhs.split(',').collect();
    if parts.len() != ranks.len() {
        return Err(n.err(format!("equation `{eq}` has {} operands but the node has {}", parts.len(), ranks.len())));
    }
    // Ellipsis letters: upper-case Greek-free private range.
    let ell: Vec<char> = (0..16u32).filter_map(|i| char::from_u32(0x3b1 + i)).collect();
    let mut max_ell = 0;
    let mut ops = Vec::new();
    for (p, &r) in parts.iter().zip(ranks) {
        let letters: Vec<char> = p.replace("...", "").chars().collect();
        let mut out = Vec::new();
        if p.contains("...") {
            let k = r.checked_sub(letters.len()).ok_or_else(|| n.err(format!("operand `{p}` has rank {r}")))?;
            max_ell = max_ell.max(k);
            let (pre, post) = p.split_once("...").unwrap_or((p, ""));
            out.extend(pre.chars());
            out.extend(ell[ell.len().min(16) - k.min(16)..].iter().take(k));
            out.extend(post.chars());
        } else {
            out = letters;
        }
        if out.len() != r {
            return Err(n.err(format!("operand `{p}` names {} dims but has rank {r}", out.len())));
        }
        ops.push(out);
    }
    let out: Vec<char> = match rhs {
        Some(r) => {
            let mut o = Vec::new();
            if let Some((pre, post)) = r.split_once("...") {
                o.extend(pre.chars());
                o.extend(ell[ell.len() - max_ell..].iter());
                o.extend(post.chars());
            } else {
                o.extend(r.chars());
            }
            o
        }
        None => {
            let mut counts = std::collections::BTreeMap::new();
            for op in &ops {
                for &c in op {
                    *counts.entry(c).or_insert(0) += 1;
                }
            }
            let mut o: Vec<char> = ell[ell.len() - max_ell..].to_vec();
            o.extend(counts.into_iter().filter(|&(c, k)| k == 1 && !ell.contains(&c)).map(|(c, _)| c));
            o
        }
    };
    Ok((ops, out))
}

/// Takes the diagonal of repeated letters, returning the tensor and its distinct letters.
fn diagonal(t: &Tensor, letters: &[char]) -> Result<(Tensor, Vec<char>)> {
    let mut t = t.clone();
    let mut ls = letters.to_vec();
    loop {
        let dup = (0..ls.len()).find_map(|i| (i + 1..ls.len()).find(|&j| ls[j] == ls[i]).map(|j| (i, j)));
        let Some((i, j)) = dup else { break };
        // Move i, j last, flatten them, pick the diagonal positions k*(d+1).
        let r = ls.len();
        let mut perm: Vec<i64> = (0..r as i64).filter(|&a| a != i as i64 && a != j as i64).collect();
        perm.push(i as i64);
        perm.push(j as i64);
        let p = call("permute", vec![v(&t), Value::Ints(perm.clone())])?;
        let d = t.shape()[i];
        let mut shape: Vec<i64> = p.shape()[..r - 2].iter().map(|&s| s as i64).collect();
        shape.push((d * d) as i64);
        let flat = call("reshape", vec![v(&call("contiguous", vec![v(&p)])?), Value::Ints(shape)])?;
        let idx: Vec<i64> = (0..d as i64).map(|k| k * (d as i64 + 1)).collect();
        t = call("index_select", vec![v(&flat), Value::Int(r as i64 - 2), v(&i64_tensor(&idx)?)])?;
        let mut nl: Vec<char> = perm[..r - 2].iter().map(|&a| ls[a as usize]).collect();
        nl.push(ls[i]);
        ls = nl;
    }
    Ok((t, ls))
}

fn einsum(n: &Node<'_>) -> Result<Vec<Tensor>> {
    let eq = n.s("equation").ok_or_else(|| n.err("`equation` is required"))?;
    let xs: Vec<Tensor> = (0..n.inputs.len()).map(|i| n.x(i).cloned()).collect::<Result<_>>()?;
    let ranks: Vec<usize> = xs.iter().map(|t| t.ndim()).collect();
    let (ops, out) = parse(n, &eq, &ranks)?;
    let mut all = out.clone();
    for op in &ops {
        for &c in op {
            if !all.contains(&c) {
                all.push(c);
            }
        }
    }
    let mut acc: Option<Tensor> = None;
    for (t, letters) in xs.iter().zip(&ops) {
        let (t, letters) = diagonal(t, letters)?;
        // Permute the operand's letters into `all` order, then reshape with 1s for missing ones.
        let order: Vec<usize> = all.iter().filter_map(|c| letters.iter().position(|l| l == c)).collect();
        let p = call("permute", vec![v(&t), Value::Ints(order.iter().map(|&i| i as i64).collect())])?;
        let shape: Vec<i64> =
            all.iter().map(|c| letters.iter().position(|l| l == c).map(|i| t.shape()[i] as i64).unwrap_or(1)).collect();
        let p = call("reshape", vec![v(&call("contiguous", vec![v(&p)])?), Value::Ints(shape)])?;
        acc = Some(match acc {
            None => p,
            Some(a) => call("mul", vec![v(&a), v(&p)])?,
        });
    }
    let acc = acc.ok_or_else(|| n.err("needs at least one operand"))?;
    let summed: Vec<i64> = (out.len()..all.len()).map(|i| i as i64).collect();
    let y = if summed.is_empty() { acc } else { call("sum", vec![v(&acc), Value::Ints(summed), Value::Bool(false)])? };
    let y = super::elementwise::cast(&y, xs[0].dtype())?;
    Ok(vec![y])
}

/// (ONNX op type, converter) for this family.
pub(crate) const TABLE: &[(&str, Convert)] = &[("Einsum", einsum)];
