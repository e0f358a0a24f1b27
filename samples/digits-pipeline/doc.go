// Package digitspipeline is the digits pipeline sample: raw MNIST pixels in,
// predicted digit out, in three functions chained by the pipeline manifest
// plover.json ("digits"):
//
//	digits-normalize  normalize/  784 uint8 pixels -> 784 float32 (k/255)
//	cnn               ../cnn      784 float32 -> 10 float32 sigmoid scores
//	digits-top1       top1/       10 float32 -> int32 label, float32 score
//
// This package holds only the tests; digits-pipeline.mk builds the bundles.
// See README.md.
package digitspipeline
