package e2b

import "testing"

// TestMetadataFilterMatchesJSSDK pins the encoding to what the official JS
// SDK (e2b 2.x) sends: the expected strings were produced by running the
// SDK's own steps (encodeURIComponent per key and value, URLSearchParams,
// then encodeURIComponent of the whole value) under Node.
func TestMetadataFilterMatchesJSSDK(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		md        map[string]string
		wantQuery string
	}{
		{"space, ampersand, equals, slash, non-ASCII", map[string]string{"gatehouse.session": "alice b&c=d/é"},
			"metadata=gatehouse.session%3Dalice%252520b%252526c%25253Dd%25252F%2525C3%2525A9"},
		{"plus and percent", map[string]string{"k": "a+b%c"},
			"metadata=k%3Da%25252Bb%252525c"},
		{"two pairs, encoded keys", map[string]string{"sp ace": "x y", "Ünï": "日本"},
			"metadata=sp%252520ace%3Dx%252520y%26%2525C3%25259Cn%2525C3%2525AF%3D%2525E6%252597%2525A5%2525E6%25259C%2525AC"},
		{"characters the two JS encoders treat differently", map[string]string{"m": "!~*'()"},
			"metadata=m%3D%2521%257E*%2527%2528%2529"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var q query
			q.add("metadata", metadataFilter(tt.md))
			if got := q.String(); got != tt.wantQuery {
				t.Errorf("query = %s\n want   %s", got, tt.wantQuery)
			}
		})
	}
}
