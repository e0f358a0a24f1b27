package manifesttest

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// Doc is one document of a manifest file.
type Doc struct {
	File  string // base name
	Index int    // 0-based, among the file's non-empty documents
	Doc   map[string]any
}

// ManifestDocs decodes every document of every *.yaml file in dir.
func ManifestDocs(dir string) ([]Doc, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	if len(files) == 0 {
		return nil, fmt.Errorf("no *.yaml in %s", dir)
	}
	var out []Doc
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		docs, err := Docs(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", f, err)
		}
		if len(docs) == 0 {
			return nil, fmt.Errorf("%s: no documents", f)
		}
		for i, d := range docs {
			out = append(out, Doc{File: filepath.Base(f), Index: i, Doc: d})
		}
	}
	return out, nil
}
