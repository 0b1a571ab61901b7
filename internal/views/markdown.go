package views

import (
	"html"
	"regexp"
	"strings"
)

// Markdown renders the small subset of Markdown the docs use (headings,
// paragraphs, bullet lists, tables, fenced code, inline code, bold and
// links) as HTML. Everything is escaped first; only the markup it adds is
// HTML. Links to sibling .md files point at the console's /docs/ pages;
// other links are kept only when relative, so a doc page never loads or
// links anything from another origin.
func Markdown(src string) string {
	var b strings.Builder
	lines := strings.Split(strings.ReplaceAll(src, "\r\n", "\n"), "\n")
	var para []string
	flush := func() {
		if len(para) > 0 {
			b.WriteString("<p>" + inline(strings.Join(para, " ")) + "</p>\n")
			para = nil
		}
	}
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		trim := strings.TrimSpace(line)
		switch {
		case trim == "":
			flush()
		case strings.HasPrefix(trim, "```"):
			flush()
			b.WriteString("<pre><code>")
			for i++; i < len(lines) && !strings.HasPrefix(strings.TrimSpace(lines[i]), "```"); i++ {
				b.WriteString(html.EscapeString(lines[i]) + "\n")
			}
			b.WriteString("</code></pre>\n")
		case strings.HasPrefix(trim, "#"):
			flush()
			level := len(trim) - len(strings.TrimLeft(trim, "#"))
			level = min(max(level, 1), 4)
			text := strings.TrimSpace(strings.TrimLeft(trim, "#"))
			tag := string(rune('0' + level))
			b.WriteString("<h" + tag + ` id="` + anchor(text) + `">` + inline(text) + "</h" + tag + ">\n")
		case strings.HasPrefix(trim, "|"):
			flush()
			b.WriteString("<table>\n")
			for row := 0; i < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[i]), "|"); i++ {
				cells := strings.Split(strings.Trim(strings.TrimSpace(lines[i]), "|"), "|")
				if strings.Trim(strings.Join(cells, ""), "-: ") == "" {
					continue // the separator row
				}
				cell := "td"
				if row == 0 {
					cell = "th"
					b.WriteString("<thead>")
				}
				b.WriteString("<tr>")
				for _, c := range cells {
					b.WriteString("<" + cell + ">" + inline(strings.TrimSpace(c)) + "</" + cell + ">")
				}
				b.WriteString("</tr>")
				if row == 0 {
					b.WriteString("</thead>\n<tbody>")
				}
				b.WriteString("\n")
				row++
			}
			i--
			b.WriteString("</tbody></table>\n")
		case strings.HasPrefix(trim, "- ") || strings.HasPrefix(trim, "* "):
			flush()
			b.WriteString("<ul>\n<li>" + inline(trim[2:]))
		items:
			for i++; i < len(lines); i++ {
				t := strings.TrimSpace(lines[i])
				switch {
				case strings.HasPrefix(t, "- ") || strings.HasPrefix(t, "* "):
					b.WriteString("</li>\n<li>" + inline(t[2:]))
				case t != "" && strings.HasPrefix(lines[i], " "):
					b.WriteString(" " + inline(t)) // a continued item
				default:
					break items
				}
			}
			i--
			b.WriteString("</li>\n</ul>\n")
		default:
			para = append(para, trim)
		}
	}
	flush()
	return b.String()
}

var (
	codeRE = regexp.MustCompile("`([^`]+)`")
	boldRE = regexp.MustCompile(`\*\*([^*]+)\*\*`)
	emRE   = regexp.MustCompile(`(^|[\s(])\*([^*\s][^*]*)\*`)
	linkRE = regexp.MustCompile(`\[([^\]]+)\]\(([^)\s]+)\)`)
)

// inline renders code, bold, emphasis and links in escaped text.
func inline(s string) string {
	s = html.EscapeString(s)
	// Code first, and kept out of the other rules by placeholders.
	var codes []string
	s = codeRE.ReplaceAllStringFunc(s, func(m string) string {
		codes = append(codes, "<code>"+m[1:len(m)-1]+"</code>")
		return "\x00" + string(rune('a'+len(codes)-1)) + "\x00"
	})
	s = boldRE.ReplaceAllString(s, "<strong>$1</strong>")
	s = emRE.ReplaceAllString(s, "$1<em>$2</em>")
	s = linkRE.ReplaceAllStringFunc(s, func(m string) string {
		p := linkRE.FindStringSubmatch(m)
		return `<a href="` + docHref(p[2]) + `">` + p[1] + "</a>"
	})
	for i, c := range codes {
		s = strings.Replace(s, "\x00"+string(rune('a'+i))+"\x00", c, 1)
	}
	return s
}

// docHref maps a link in a doc to a console address: sibling documents
// become /docs/<name>; absolute URLs to other sites are dropped to "#".
func docHref(u string) string {
	if strings.Contains(u, "://") || strings.HasPrefix(u, "//") {
		return "#"
	}
	name, frag, _ := strings.Cut(u, "#")
	if name == "" {
		return "#" + frag
	}
	if strings.HasSuffix(name, ".md") && !strings.Contains(name, "/") {
		u = "/docs/" + strings.TrimSuffix(name, ".md")
		if frag != "" {
			u += "#" + frag
		}
		return u
	}
	return "#"
}

// anchor is a heading's id, as GitHub derives it.
func anchor(s string) string {
	s = strings.ToLower(s)
	var b strings.Builder
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}
