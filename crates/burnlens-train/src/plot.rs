//! The loss curve of a run as a self-contained SVG (no plotting library, opens anywhere).

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

/// Plot training loss per step and validation loss per evaluation from `metrics.jsonl` lines.
pub fn write_loss_svg(path: &Path, history: &[Value]) -> Result<(), burnlens_model::files::FileError> {
    let series = |kind: &str, key: &str| -> Vec<(f64, f64)> {
        history.iter().filter(|v| v["kind"] == kind).filter_map(|v| Some((v["step"].as_f64()?, v[key].as_f64()?))).filter(|(_, y)| y.is_finite()).collect()
    };
    let train = series("train", "loss");
    let val = series("eval", "val_loss");
    burnlens_model::files::write_atomic(path, render(&train, &val).as_bytes())
}

fn render(train: &[(f64, f64)], val: &[(f64, f64)]) -> String {
    let (w, h, left, right, top, bottom) = (720.0, 420.0, 60.0, 20.0, 30.0, 45.0);
    let all = || train.iter().chain(val.iter());
    let x_max = all().map(|p| p.0).fold(1.0, f64::max);
    let y_min = all().map(|p| p.1).fold(f64::INFINITY, f64::min).min(1e9);
    let y_max = all().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max).max(-1e9);
    let (y_min, y_max) = if y_min.is_finite() && y_max > y_min { (y_min, y_max) } else { (0.0, 1.0) };
    let px = |x: f64| left + x / x_max * (w - left - right);
    let py = |y: f64| top + (y_max - y) / (y_max - y_min) * (h - top - bottom);
    let mut s = String::new();
    let _ = write!(s, r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#);
    let _ = write!(s, r#"<rect width="{w}" height="{h}" fill="white"/><text x="{}" y="18" text-anchor="middle" font-size="14">loss</text>"#, w / 2.0);
    for i in 0..=5 {
        let y = y_min + (y_max - y_min) * i as f64 / 5.0;
        let _ = write!(
            s,
            r##"<line x1="{left}" x2="{}" y1="{py:.1}" y2="{py:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{y:.3}</text>"##,
            w - right,
            left - 6.0,
            py(y) + 4.0,
            py = py(y)
        );
        let x = x_max * i as f64 / 5.0;
        let _ = write!(s, r#"<text x="{:.1}" y="{}" text-anchor="middle">{x:.0}</text>"#, px(x), h - bottom + 16.0);
    }
    let _ = write!(s, r#"<text x="{}" y="{}" text-anchor="middle">step</text>"#, w / 2.0, h - 8.0);
    let _ = write!(s, r##"<rect x="{left}" y="{top}" width="{}" height="{}" fill="none" stroke="#444"/>"##, w - left - right, h - top - bottom);
    for (pts, color, label, dy) in [(train, "#1f77b4", "train", 0.0), (val, "#d62728", "validation", 16.0)] {
        if pts.is_empty() {
            continue;
        }
        let coords: Vec<String> = pts.iter().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
        let _ = write!(s, r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#, coords.join(" "));
        let _ = write!(s, r#"<text x="{}" y="{}" fill="{color}">{label}</text>"#, w - right - 90.0, top + 16.0 + dy);
    }
    s.push_str("</svg>\n");
    s
}
