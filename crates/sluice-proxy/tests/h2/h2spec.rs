//! h2spec placeholder (filled below).
