// Command trimcrds cuts testdata/*.schema.yaml from KServe's full CRDs: the
// parts of each schema that the manifests in deploy/kserve use. Run it from
// deploy/kserve/manifesttest (testdata/README.md says when and how):
//
//	go run ./cmd/trimcrds -crds KSERVE/config/crd/full -ref v0.20.0 -commit SHA
//
// With -check it writes nothing and fails when a subset differs from what
// it would write.
package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/plover-run/plover/deploy/kserve/manifesttest"
)

// Kinds are the CRDs the manifests use: the CRD file under config/crd/full,
// the version, and the subset file under testdata.
var kinds = []struct{ crd, version, kind, out string }{
	{"serving.kserve.io_clusterservingruntimes.yaml", "v1alpha1", "ClusterServingRuntime", "clusterservingruntime.v1alpha1.schema.yaml"},
	{"serving.kserve.io_inferenceservices.yaml", "v1beta1", "InferenceService", "inferenceservice.v1beta1.schema.yaml"},
}

func main() {
	crds := flag.String("crds", "", "KServe's config/crd/full directory")
	ref := flag.String("ref", "", "the KServe tag or branch the CRDs come from")
	commit := flag.String("commit", "", "the KServe commit the CRDs come from (40 hex digits)")
	manifests := flag.String("manifests", "..", "the directory holding the manifests (*.yaml)")
	out := flag.String("out", "testdata", "where the subsets go")
	check := flag.Bool("check", false, "compare with the subsets in -out instead of writing them")
	flag.Parse()
	if *crds == "" || *commit == "" || *ref == "" {
		fmt.Fprintln(os.Stderr, "trimcrds: -crds, -ref and -commit are required")
		os.Exit(2)
	}
	if err := run(*crds, *ref, *commit, *manifests, *out, *check); err != nil {
		fmt.Fprintln(os.Stderr, "trimcrds:", err)
		os.Exit(1)
	}
}

func run(crds, ref, commit, manifests, out string, check bool) error {
	docs, err := manifesttest.ManifestDocs(manifests)
	if err != nil {
		return err
	}
	for _, k := range kinds {
		var mine []map[string]any
		for _, d := range docs {
			if d.Doc["kind"] == k.kind {
				mine = append(mine, d.Doc)
			}
		}
		if len(mine) == 0 {
			return fmt.Errorf("no %s among the manifests in %s", k.kind, manifests)
		}
		path := filepath.Join(crds, k.crd)
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		src := manifesttest.Source{
			Repository: "github.com/kserve/kserve", Ref: ref, Commit: commit,
			Path: "config/crd/full/" + k.crd, SHA256: hex.EncodeToString(sum[:]),
		}
		sub, err := manifesttest.CutSubset(path, k.version, src, mine)
		if err != nil {
			return err
		}
		header := fmt.Sprintf("# Cut by cmd/trimcrds from KServe's %s\n"+
			"# at %s (%s): only the paths the manifests in deploy/kserve use;\n"+
			"# x-plover-trimmed names the properties left out. Do not edit by hand:\n"+
			"# see testdata/README.md.\n", src.Path, ref, commit)
		b, err = manifesttest.Marshal(sub, header)
		if err != nil {
			return err
		}
		dst := filepath.Join(out, k.out)
		if check {
			have, err := os.ReadFile(dst)
			if err != nil {
				return err
			}
			if !bytes.Equal(have, b) {
				return fmt.Errorf("%s differs from what %s at %s gives: run without -check", dst, src.Path, commit)
			}
			fmt.Println("same:", dst)
			continue
		}
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			return err
		}
		fmt.Println("wrote", dst)
	}
	return nil
}
