package repository

// ScanEmptied is scanEmptied, for the package's external tests.
var ScanEmptied = scanEmptied
