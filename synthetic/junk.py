"""Seeded junk web pages in Spanish, Portuguese and English: what a curation config must remove.

`junk_documents(lang, n, seed)` gives `n` documents spread over the kinds below, each built from
vocabularies and layouts drawn at random (sites, menus, products, prices, code, number formats),
so no two share a template and a filter tuned on one layout does not pass by luck:

    navigation   menus, breadcrumbs, footers, cookie and newsletter banners
    keyboard     keyboard mashing and character noise, with or without spaces
    keyword_spam search-engine stuffing: a few keywords and city names repeated in varied orders
    link_list    lists of article titles / related links, one per line, no sentences
    javascript   inline scripts, JSON configs, minified code
    numbers      tables of figures: prices, results, statistics, timetables
    products     product listings: name, price, stock, "add to cart"
    repeated     one real-looking paragraph repeated several times (a broken template)

Used to calibrate and check configs/curate/default.yaml (bench/calibrate_default.py) and by the
test that runs it as shipped (tests/test_calibration.py). Deterministic for a seed.
"""
from __future__ import annotations

import random
import string

KINDS = ("navigation", "keyboard", "keyword_spam", "link_list", "javascript", "numbers", "products", "repeated")

WORDS = {
    "es": {
        "menu": ["Inicio", "Noticias", "Deportes", "Economía", "Cultura", "Contacto", "Quiénes somos", "Blog", "Tienda",
                 "Ofertas", "Mi cuenta", "Iniciar sesión", "Registrarse", "Buscar", "Ayuda", "Política", "Opinión",
                 "Tecnología", "Viajes", "Salud", "Suscríbete", "Aviso legal", "Mapa del sitio", "Empleo", "Prensa"],
        "cookie": ["Utilizamos cookies propias y de terceros para mejorar nuestros servicios.",
                   "Si continúa navegando, consideramos que acepta su uso.", "Aceptar todas", "Rechazar",
                   "Configurar cookies", "Más información", "Política de privacidad", "Política de cookies",
                   "Este sitio web utiliza cookies", "Acepto", "Guardar preferencias"],
        "footer": ["© {y} Todos los derechos reservados", "Síguenos en Facebook", "Síguenos en Twitter",
                   "Aviso legal", "Condiciones de uso", "Contacto: info@{site}", "Tel. {phone}", "Volver arriba",
                   "Suscríbete a nuestro boletín", "Descarga nuestra app"],
        "keywords": ["comprar", "barato", "oferta", "zapatillas", "móviles", "hoteles", "vuelos", "seguros", "préstamos",
                     "abogados", "dentista", "mejor precio", "envío gratis", "online", "outlet", "descuento", "casino",
                     "apuestas", "alquiler", "pisos"],
        "places": ["Madrid", "Barcelona", "Valencia", "Sevilla", "Bilbao", "Málaga", "México", "Buenos Aires", "Bogotá",
                   "Lima", "Santiago", "Zaragoza"],
        "titles": ["Cómo elegir el mejor {k}", "Los 10 mejores {k} de {y}", "Guía completa de {k}", "{k}: todo lo que debes saber",
                   "Descubre las ofertas en {k}", "¿Dónde comprar {k}?", "Opiniones sobre {k}", "Nuevo {k} en {p}",
                   "Ver más", "Leer más", "Ir a la sección de {k}", "Galería de fotos: {k}"],
        "products": ["Zapatillas deportivas", "Camiseta básica", "Auriculares inalámbricos", "Funda para móvil",
                     "Cafetera espresso", "Mochila urbana", "Reloj inteligente", "Lámpara LED", "Silla de oficina",
                     "Taladro percutor", "Colchón viscoelástico", "Bicicleta de montaña"],
        "shop": ["Añadir al carrito", "En stock", "Agotado", "Envío gratis", "Ver detalles", "Comprar ahora", "Unidades",
                 "Valoración", "Precio", "Antes", "Ahorra", "IVA incluido", "Disponible en 24 h"],
        "table": ["Equipo", "Puntos", "Partidos", "Ganados", "Perdidos", "Fecha", "Precio", "Variación", "Volumen",
                  "Máx.", "Mín.", "Cierre", "Hora", "Salida", "Llegada", "Total"],
        "para": ["El ayuntamiento ha anunciado que las obras de la plaza mayor comenzarán el próximo lunes y durarán tres meses.",
                 "Nuestra empresa ofrece servicios de limpieza para oficinas y comunidades de vecinos con la mejor calidad.",
                 "Regístrate ahora y recibe un descuento del diez por ciento en tu primera compra en nuestra tienda online.",
                 "La asociación de vecinos celebrará su asamblea anual en el centro cívico para hablar de los presupuestos.",
                 "Si tienes cualquier duda sobre tu pedido, ponte en contacto con nuestro equipo de atención al cliente."],
        "currency": "€", "decimal": ",",
    },
    "pt": {
        "menu": ["Início", "Notícias", "Esportes", "Economia", "Cultura", "Contato", "Quem somos", "Blog", "Loja",
                 "Ofertas", "Minha conta", "Entrar", "Cadastre-se", "Buscar", "Ajuda", "Política", "Opinião",
                 "Tecnologia", "Viagens", "Saúde", "Assine", "Termos de uso", "Mapa do site", "Trabalhe conosco", "Imprensa"],
        "cookie": ["Utilizamos cookies para melhorar sua experiência em nosso site.",
                   "Ao continuar navegando, você concorda com a nossa política de privacidade.", "Aceitar todos",
                   "Rejeitar", "Configurar cookies", "Saiba mais", "Política de privacidade", "Política de cookies",
                   "Este site usa cookies", "Concordo", "Salvar preferências"],
        "footer": ["© {y} Todos os direitos reservados", "Siga-nos no Facebook", "Siga-nos no Instagram",
                   "Termos e condições", "Fale conosco: contato@{site}", "Tel. {phone}", "Voltar ao topo",
                   "Assine a nossa newsletter", "Baixe o nosso aplicativo", "CNPJ 12.345.678/0001-90"],
        "keywords": ["comprar", "barato", "promoção", "tênis", "celulares", "hotéis", "passagens", "seguro", "empréstimo",
                     "advogado", "dentista", "melhor preço", "frete grátis", "online", "outlet", "desconto", "cassino",
                     "apostas", "aluguel", "apartamentos"],
        "places": ["São Paulo", "Rio de Janeiro", "Belo Horizonte", "Salvador", "Curitiba", "Recife", "Lisboa", "Porto",
                   "Brasília", "Fortaleza", "Manaus", "Coimbra"],
        "titles": ["Como escolher o melhor {k}", "Os 10 melhores {k} de {y}", "Guia completo de {k}", "{k}: tudo o que você precisa saber",
                   "Confira as ofertas de {k}", "Onde comprar {k}?", "Avaliações de {k}", "Novo {k} em {p}",
                   "Veja mais", "Leia mais", "Ir para a seção de {k}", "Galeria de fotos: {k}"],
        "products": ["Tênis de corrida", "Camiseta básica", "Fone de ouvido sem fio", "Capinha para celular",
                     "Cafeteira elétrica", "Mochila para notebook", "Relógio inteligente", "Luminária LED",
                     "Cadeira de escritório", "Furadeira de impacto", "Colchão de molas", "Bicicleta aro 29"],
        "shop": ["Adicionar ao carrinho", "Em estoque", "Esgotado", "Frete grátis", "Ver detalhes", "Comprar agora",
                 "Unidades", "Avaliação", "Preço", "De", "Por", "Economize", "em até 10x sem juros"],
        "table": ["Time", "Pontos", "Jogos", "Vitórias", "Derrotas", "Data", "Preço", "Variação", "Volume", "Máx.",
                  "Mín.", "Fechamento", "Horário", "Partida", "Chegada", "Total"],
        "para": ["A prefeitura anunciou que as obras da praça central começam na próxima segunda-feira e devem durar três meses.",
                 "Nossa empresa oferece serviços de limpeza para escritórios e condomínios com a melhor qualidade da região.",
                 "Cadastre-se agora e ganhe dez por cento de desconto na sua primeira compra em nossa loja virtual.",
                 "A associação de moradores fará sua assembleia anual no centro comunitário para discutir o orçamento.",
                 "Em caso de dúvidas sobre o seu pedido, entre em contato com a nossa equipe de atendimento ao cliente."],
        "currency": "R$", "decimal": ",",
    },
    "en": {
        "menu": ["Home", "News", "Sports", "Business", "Culture", "Contact", "About us", "Blog", "Shop", "Deals",
                 "My account", "Sign in", "Register", "Search", "Help", "Politics", "Opinion", "Technology", "Travel",
                 "Health", "Subscribe", "Legal notice", "Sitemap", "Careers", "Press"],
        "cookie": ["We use cookies to improve your experience on our website.",
                   "By continuing to browse, you agree to our use of cookies.", "Accept all", "Reject", "Cookie settings",
                   "Learn more", "Privacy policy", "Cookie policy", "This website uses cookies", "I agree", "Save preferences"],
        "footer": ["© {y} All rights reserved", "Follow us on Facebook", "Follow us on Twitter", "Terms of service",
                   "Contact: hello@{site}", "Call {phone}", "Back to top", "Sign up for our newsletter", "Get the app",
                   "Do not sell my personal information"],
        "keywords": ["buy", "cheap", "deal", "sneakers", "phones", "hotels", "flights", "insurance", "loans", "lawyer",
                     "dentist", "best price", "free shipping", "online", "outlet", "discount", "casino", "betting",
                     "rentals", "apartments"],
        "places": ["New York", "London", "Chicago", "Houston", "Los Angeles", "Miami", "Toronto", "Sydney", "Dallas",
                   "Boston", "Seattle", "Denver"],
        "titles": ["How to choose the best {k}", "Top 10 {k} of {y}", "The complete guide to {k}", "{k}: everything you need to know",
                   "Check out the deals on {k}", "Where to buy {k}?", "Reviews of {k}", "New {k} in {p}", "See more",
                   "Read more", "Go to the {k} section", "Photo gallery: {k}"],
        "products": ["Running shoes", "Basic T-shirt", "Wireless earbuds", "Phone case", "Espresso machine", "Laptop backpack",
                     "Smart watch", "LED desk lamp", "Office chair", "Hammer drill", "Memory foam mattress", "Mountain bike"],
        "shop": ["Add to cart", "In stock", "Sold out", "Free shipping", "View details", "Buy now", "Qty", "Rating",
                 "Price", "Was", "Save", "Ships in 24h", "Only 3 left"],
        "table": ["Team", "Points", "Played", "Won", "Lost", "Date", "Price", "Change", "Volume", "High", "Low", "Close",
                  "Time", "Departs", "Arrives", "Total"],
        "para": ["The city council has announced that work on the main square will start next Monday and last three months.",
                 "Our company provides cleaning services for offices and residential buildings with the highest quality.",
                 "Sign up now and get ten percent off your first order in our online store, today only.",
                 "The residents association will hold its annual meeting at the community centre to discuss the budget.",
                 "If you have any questions about your order, please contact our customer service team."],
        "currency": "$", "decimal": ".",
    },
}


def _price(rng: random.Random, w: dict) -> str:
    value = f"{rng.randint(1, 999)}{w['decimal']}{rng.randint(0, 99):02d}"
    return f"{w['currency']} {value}" if w["currency"] == "R$" or rng.random() < 0.3 else (
        f"{value} {w['currency']}" if w["currency"] == "€" else f"{w['currency']}{value}")


def _site(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(5, 10))) + rng.choice([".com", ".es", ".com.br", ".pt", ".net", ".org", ".com.mx"])


def _phone(rng: random.Random) -> str:
    return " ".join(str(rng.randint(100, 999)) for _ in range(3))


def _fill(s: str, rng: random.Random, w: dict) -> str:
    return s.format(y=rng.randint(2015, 2026), site=_site(rng), phone=_phone(rng), k=rng.choice(w["keywords"]),
                    p=rng.choice(w["places"]))


def navigation(rng, w) -> str:
    parts = []
    for block in rng.sample(["menu", "crumbs", "cookie", "footer", "menu2", "social"], rng.randint(3, 6)):
        if block.startswith("menu"):
            items = rng.sample(w["menu"], rng.randint(5, 12))
            sep = rng.choice(["\n", " | ", " · ", "\n", " / "])
            parts.append(sep.join(items))
        elif block == "crumbs":
            parts.append(" > ".join(rng.sample(w["menu"], rng.randint(2, 4))))
        elif block == "cookie":
            parts.append("\n".join(rng.sample(w["cookie"], rng.randint(3, 7))))
        elif block == "footer":
            parts.append("\n".join(_fill(s, rng, w) for s in rng.sample(w["footer"], rng.randint(3, 7))))
        else:
            parts.append("\n".join(rng.sample(["Facebook", "Twitter", "Instagram", "YouTube", "LinkedIn", "WhatsApp", "TikTok", "RSS"], 4)))
    return "\n\n".join(parts) if rng.random() < 0.5 else "\n".join(parts)


def keyboard(rng, w) -> str:
    rows = ["qwertyuiop", "asdfghjklñ" if rng.random() < 0.5 else "asdfghjkl", "zxcvbnm", "1234567890"]
    style = rng.choice(["words", "mash", "lines"])
    if style == "mash":
        return "".join(rng.choice(rows[rng.randrange(4)]) + (" " if rng.random() < 0.05 else "") for _ in range(rng.randint(200, 900)))
    words = []
    for _ in range(rng.randint(60, 250)):
        row = rows[rng.randrange(3)]
        start = rng.randrange(len(row) - 3)
        word = row[start:start + rng.randint(2, 7)]
        if rng.random() < 0.3:
            word = "".join(rng.sample(word, len(word)))
        words.append(word.upper() if rng.random() < 0.1 else word)
        if style == "lines" and rng.random() < 0.1:
            words.append("\n")
    return " ".join(words).replace(" \n ", "\n")


def keyword_spam(rng, w) -> str:
    keys = rng.sample(w["keywords"], rng.randint(3, 6))
    places = rng.sample(w["places"], rng.randint(2, 6))
    lines = []
    for _ in range(rng.randint(8, 30)):
        phrase = [rng.choice(keys) for _ in range(rng.randint(2, 5))]
        if rng.random() < 0.6:
            phrase.append(rng.choice(places))
        lines.append(" ".join(phrase))
    sep = rng.choice([", ", " ", " - ", "\n", ". "])
    text = sep.join(lines)
    return text[0].upper() + text[1:]


def link_list(rng, w) -> str:
    lines = []
    for _ in range(rng.randint(10, 40)):
        title = _fill(rng.choice(w["titles"]), rng, w)
        title = title[0].upper() + title[1:]
        style = rng.random()
        if style < 0.3:
            lines.append(f"https://www.{_site(rng)}/{title.lower().replace(' ', '-')[:40]}")
        elif style < 0.6:
            lines.append(f"» {title}")
        elif style < 0.8:
            lines.append(f"- {title} ({rng.randint(1, 300)})")
        else:
            lines.append(title)
    return "\n".join(lines)


def javascript(rng, w) -> str:
    names = ["config", "init", "trackEvent", "loadAds", "gtag", "dataLayer", "onReady", "renderMenu", "slider"]
    out = []
    for _ in range(rng.randint(4, 14)):
        name = rng.choice(names) + str(rng.randint(0, 99))
        kind = rng.random()
        if kind < 0.3:
            out.append(f"var {name} = {{\"id\": {rng.randint(1, 9999)}, \"lang\": \"{rng.choice(['es', 'pt', 'en'])}\", "
                       f"\"enabled\": {rng.choice(['true', 'false'])}}};")
        elif kind < 0.6:
            out.append(f"function {name}(e) {{ if (!e) return; document.getElementById('{rng.choice(w['menu']).lower()}')"
                       f".classList.toggle('open'); }}")
        elif kind < 0.8:
            out.append(f"window.{name} = window.{name} || []; {name}.push({{'event': '{rng.choice(w['keywords'])}', "
                       f"'value': {rng.randint(0, 100)}}});")
        else:
            out.append("!function(a,b){a.q=a.q||[];var c=b.createElement('script');c.async=1;c.src='https://cdn."
                       f"{_site(rng)}/{name}.js';b.head.appendChild(c)}}(window,document);")
    return ("\n" if rng.random() < 0.7 else " ").join(out)


def numbers(rng, w) -> str:
    cols = rng.sample(w["table"], rng.randint(3, 6))
    sep = rng.choice(["\t", " | ", "  ", ";", " "])
    lines = [sep.join(cols)]
    for _ in range(rng.randint(8, 40)):
        row = []
        for c in range(len(cols)):
            r = rng.random()
            if r < 0.4:
                row.append(str(rng.randint(0, 999)))
            elif r < 0.7:
                row.append(f"{rng.randint(0, 99)}{w['decimal']}{rng.randint(0, 99):02d}")
            elif r < 0.85:
                row.append(f"{rng.randint(1, 28):02d}/{rng.randint(1, 12):02d}/{rng.randint(2000, 2026)}")
            else:
                row.append(f"{rng.choice('+-')}{rng.randint(0, 9)}{w['decimal']}{rng.randint(0, 99)}%")
        if rng.random() < 0.3:
            row[0] = rng.choice(w["places"])
        lines.append(sep.join(row))
    return "\n".join(lines)


def products(rng, w) -> str:
    lines = []
    for _ in range(rng.randint(5, 20)):
        name = f"{rng.choice(w['products'])} {rng.choice(['', 'Pro', 'Max', 'XL', str(rng.randint(2, 900))])}".strip()
        fields = [name, _price(rng, w)]
        fields += rng.sample(w["shop"], rng.randint(1, 4))
        if rng.random() < 0.4:
            fields.append(f"★★★★☆ ({rng.randint(1, 999)})")
        layout = rng.random()
        lines.append(("\n".join(fields) + "\n") if layout < 0.4 else rng.choice([" - ", " | ", "  ", " · "]).join(fields))
    return "\n".join(lines)


def repeated(rng, w) -> str:
    para = rng.choice(w["para"])
    if rng.random() < 0.5:
        para = para + " " + rng.choice([p for p in w["para"] if p != para])
    times = rng.randint(3, 12)
    sep = rng.choice(["\n\n", "\n", " "])
    return sep.join([para] * times)


MAKERS = {"navigation": navigation, "keyboard": keyboard, "keyword_spam": keyword_spam, "link_list": link_list,
          "javascript": javascript, "numbers": numbers, "products": products, "repeated": repeated}


def junk_documents(lang: str, n: int, seed: int = 0) -> list[dict]:
    """`n` junk documents in `lang` (es, pt, en), the kinds in turn: {id, text, lang, kind}."""
    rng = random.Random(f"{lang}-{seed}")
    w = WORDS[lang]
    docs = []
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        docs.append({"id": f"junk-{lang}-{seed}-{i:05d}", "text": MAKERS[kind](rng, w).strip(), "lang": lang, "kind": kind})
    return docs
