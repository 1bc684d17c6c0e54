//! Reference scalar interpreter (written by the codegen helper).
