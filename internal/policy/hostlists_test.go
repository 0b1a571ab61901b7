package policy_test

import (
	"slices"
	"testing"

	"github.com/gatehouse/gatehouse/internal/policy"
)

func TestHostLists(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name            string
		p               policy.Network
		allow, deny     []string
		internet, exact bool
	}{
		{"open", policy.Network{Default: policy.Allow}, nil, nil, true, true},
		{"an allow list", policy.Network{Default: policy.Deny, Rules: []policy.NetRule{
			{Action: policy.Allow, Host: "github.com"}, {Action: policy.Allow, Host: "10.0.0.0/8"}}},
			[]string{"github.com", "10.0.0.0/8"}, nil, false, true},
		{"an allow list narrowed to ports", policy.Network{Default: policy.Deny, Rules: []policy.NetRule{
			{Action: policy.Allow, Host: "github.com", Ports: []int{443}}}},
			[]string{"github.com"}, nil, false, false},
		{"ask under deny is let through to agentd", policy.Network{Default: policy.Deny, Rules: []policy.NetRule{
			{Action: policy.Ask, Host: "*.example.com"}}},
			[]string{"*.example.com"}, nil, false, false},
		{"deny list", policy.Network{Default: policy.Allow, Rules: []policy.NetRule{
			{Action: policy.Deny, Host: "169.254.0.0/16"}, {Action: policy.Deny, Host: "evil.test", Methods: []string{"POST"}}}},
			nil, []string{"169.254.0.0/16"}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			allow, deny, internet, exact := tc.p.HostLists()
			if !slices.Equal(allow, tc.allow) || !slices.Equal(deny, tc.deny) || internet != tc.internet || exact != tc.exact {
				t.Errorf("HostLists = %v %v %v %v, want %v %v %v %v", allow, deny, internet, exact, tc.allow, tc.deny, tc.internet, tc.exact)
			}
		})
	}
}
