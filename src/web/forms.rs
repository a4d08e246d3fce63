//! Helpers for forms that re-render with one message per field.

use std::collections::BTreeMap;

/// Messages by field name.
#[derive(Debug, Default, Clone)]
pub struct FieldErrors(BTreeMap<String, String>);

impl FieldErrors {
    pub fn add(&mut self, field: &str, message: impl Into<String>) {
        self.0
            .entry(field.to_string())
            .or_insert_with(|| message.into());
    }

    pub fn get(&self, field: &str) -> Option<&String> {
        self.0.get(field)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}

/// One input of a generated form.
#[derive(Debug, Clone)]
pub struct Field {
    pub name: &'static str,
    pub label: &'static str,
    pub hint: &'static str,
    pub value: String,
    pub error: Option<String>,
    /// `number`, `text` or `select`.
    pub kind: &'static str,
    pub options: Vec<&'static str>,
    pub min: &'static str,
    pub max: &'static str,
}

impl Field {
    pub fn is_selected(&self, option: &str) -> bool {
        self.value == option
    }
}
