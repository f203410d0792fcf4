//! Views printed as a table (for people) or as JSON or YAML (for scripts).

use clap::ValueEnum;
use serde::Serialize;

#[derive(Clone, Copy, Debug, Default, ValueEnum)]
pub enum Format {
    #[default]
    Table,
    Json,
    Yaml,
}

/// A view that can also lay itself out as a table.
pub trait Table: Serialize {
    fn table(&self) -> String;
}

pub fn render(view: &impl Table, format: Format) -> anyhow::Result<String> {
    Ok(match format {
        Format::Table => view.table(),
        Format::Json => serde_json::to_string_pretty(view)? + "\n",
        Format::Yaml => serde_yaml::to_string(view)?,
    })
}

/// Rows laid out in columns as wide as their widest cell, two spaces apart.
pub fn columns(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<String>| {
        let last = cells.len().saturating_sub(1);
        let mut out = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            if i == last {
                out.push_str(&cell);
            } else {
                let pad = widths[i].saturating_sub(cell.chars().count()) + 2;
                out.push_str(&cell);
                out.push_str(&" ".repeat(pad));
            }
        }
        out.trim_end().to_owned() + "\n"
    };
    let mut out = line(header.iter().map(|h| (*h).to_owned()).collect());
    for row in rows {
        out.push_str(&line(row.clone()));
    }
    out
}

/// Text cut to `max` characters on a character boundary, with an ellipsis when cut; control
/// characters (a hostile commit message's newlines or escapes) become spaces.
pub fn cell(text: &str, max: usize) -> String {
    let clean: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if clean.chars().count() <= max {
        clean
    } else {
        clean
            .chars()
            .take(max.saturating_sub(1))
            .collect::<String>()
            + "…"
    }
}

/// A commit id as people read it: its first 12 characters.
pub fn short(id: &str) -> String {
    id.chars().take(12).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_and_cells_are_cut_and_cleaned() {
        let table = columns(
            &["A", "BB"],
            &[
                vec!["long cell".into(), "x".into()],
                vec!["s".into(), "y".into()],
            ],
        );
        assert_eq!(table, "A          BB\nlong cell  x\ns          y\n");
        assert_eq!(cell("a\nb\u{1b}[31m", 20), "a b [31m");
        assert_eq!(cell("ééééé", 3), "éé…");
    }
}
