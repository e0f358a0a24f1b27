package engine

// For the engine_test package's tests.
var WaitFor = waitFor
